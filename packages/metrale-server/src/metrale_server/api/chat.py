"""``POST /v1/chat/completions``: a chat completion, whole or streamed."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metrale_server.api.chat_output import ChoiceReader, delta_body, finish_reason, message_body
from metrale_server.api.fields import parse_json_object
from metrale_server.api.generation import (
    Generation,
    close_all,
    final_outputs,
    merge_outputs,
    start_generations,
)
from metrale_server.api.logprobs import chat_logprobs, prompt_logprobs_body
from metrale_server.api.protocol import ChatRequest, parse_chat_request
from metrale_server.api.responses import (
    ChoiceProgress,
    ResponseHeader,
    raise_if_failed,
    usage_body,
)
from metrale_server.api.state import ServerState
from metrale_server.api.streaming import EventStreamResponse, sse_event
from metrale_server.api.structured_fields import compile_structured
from metrale_server.output.outputs import RequestOutput

ROLE = "assistant"


async def create_chat_completion(request: Request, *, state: ServerState) -> Response:
    raw = await request.body()
    parsed = await state.preparer.run(
        lambda: parse_chat_request(
            parse_json_object(raw),
            state.engine,
            state.served_model_name,
            tool_call_parser=state.tool_call_parser,
            image_limits=state.image_limits,
        )
    )
    grammar = await compile_structured(
        lambda: state.engine.grammar_compiler, parsed.structured, state.preparer
    )
    header = ResponseHeader.new(
        id_prefix="chatcmpl",
        object="chat.completion.chunk" if parsed.stream.is_streamed else "chat.completion",
        model=state.served_model_name,
    )
    generations = start_generations(state, header.id, [parsed.prompt], grammar)
    if parsed.stream.is_streamed:
        return EventStreamResponse(
            chat_events(state, parsed, generations, header),
            on_close=partial(close_all, generations),
        )
    [final] = await final_outputs(generations, request.receive)
    return JSONResponse(chat_body(state, parsed, final, header))


def chat_body(
    state: ServerState, request: ChatRequest, final: RequestOutput, header: ResponseHeader
) -> dict[str, Any]:
    raise_if_failed(final)
    choices = []
    for output in final.outputs:
        reader = choice_reader(state, request)
        message = reader.read(output.text)
        choices.append(
            {
                "index": output.index,
                "message": message_body(reader, message),
                "logprobs": None
                if request.num_top_logprobs is None
                else chat_logprobs(output.logprobs or (), state.token_texts),
                "finish_reason": finish_reason(
                    request.tools, output.finish_reason, bool(message.calls)
                ),
                "stop_reason": output.stop_reason,
            }
        )
    extra = {}
    if request.prompt.params.prompt_logprobs is not None and final.prompt_logprobs is not None:
        extra["prompt_logprobs"] = prompt_logprobs_body(final.prompt_logprobs, state.token_texts)
    return header.body(choices, usage=usage_body([request.prompt], [final]), **extra)


def choice_reader(state: ServerState, request: ChatRequest) -> ChoiceReader:
    """A new reader for one of the request's choices (the server's parsers, its tool choice)."""
    structured = request.structured
    return ChoiceReader.for_request(
        request.tools,
        tool_call_parser=state.tool_call_parser,
        reasoning_parser=state.reasoning_parser,
        is_json_constrained=structured is not None
        and structured.params.kind in ("json", "json_object"),
    )


async def chat_events(
    state: ServerState,
    request: ChatRequest,
    generations: Sequence[Generation],
    header: ResponseHeader,
) -> AsyncGenerator[str, None]:
    """A role chunk per choice first, then one chunk per choice whenever it has news."""
    extra = {"usage": None} if request.stream.include_usage else {}
    num_choices = request.prompt.params.n
    for index in range(num_choices):
        delta = {"role": ROLE, "content": ""}
        yield sse_event(header.body([_choice(index, delta, None, None)], **extra))
    progress = [ChoiceProgress() for _ in range(num_choices)]
    readers = [choice_reader(state, request) for _ in range(num_choices)]
    has_calls = [False] * num_choices
    finals: list[RequestOutput] = []
    merged = merge_outputs(generations)
    try:
        async for _, output in merged:
            raise_if_failed(output)
            if output.finished:
                finals.append(output)
            for completion in output.outputs:
                index = completion.index
                sent = progress[index]
                entries = sent.new_logprobs(completion)
                if not sent.has_news(completion, entries):
                    continue
                read = readers[index].feed(completion.delta_text, is_final=completion.finished)
                has_calls[index] |= bool(read.calls)
                delta = delta_body(readers[index], read)
                if not (delta or entries or completion.finished):
                    continue  # the readers hold this text back until they know what it is
                logprobs = None
                if request.num_top_logprobs is not None:
                    logprobs = chat_logprobs(entries, state.token_texts)
                reason = finish_reason(request.tools, completion.finish_reason, has_calls[index])
                chunk = _choice(index, delta, logprobs, reason)
                yield sse_event(header.body([chunk], **extra))
    finally:
        await merged.aclose()
    if request.stream.include_usage:
        yield sse_event(header.body([], usage=usage_body([request.prompt], finals)))


def _choice(
    index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None, finish_reason: str | None
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
