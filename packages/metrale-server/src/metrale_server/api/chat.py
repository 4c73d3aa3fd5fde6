"""``POST /v1/chat/completions``: a chat completion, whole or streamed."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metrale_server.api.fields import parse_json_object
from metrale_server.api.generation import (
    Generation,
    close_all,
    final_outputs,
    merge_outputs,
    start_generations,
)
from metrale_server.api.logprobs import chat_logprobs
from metrale_server.api.protocol import ChatRequest, parse_chat_request
from metrale_server.api.responses import (
    ChoiceProgress,
    ResponseHeader,
    raise_if_failed,
    usage_body,
)
from metrale_server.api.state import ServerState
from metrale_server.api.streaming import EventStreamResponse, sse_event
from metrale_server.output.outputs import RequestOutput

ROLE = "assistant"


async def create_chat_completion(request: Request, *, state: ServerState) -> Response:
    body = parse_json_object(await request.body())
    parsed = parse_chat_request(body, state.engine, state.served_model_name)
    header = ResponseHeader.new(
        id_prefix="chatcmpl",
        object="chat.completion.chunk" if parsed.stream.is_streamed else "chat.completion",
        model=state.served_model_name,
    )
    generations = start_generations(state, header.id, [parsed.prompt])
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
    choices = [
        {
            "index": output.index,
            "message": {"role": ROLE, "content": output.text},
            "logprobs": None
            if request.num_top_logprobs is None
            else chat_logprobs(output.logprobs or (), state.token_texts),
            "finish_reason": output.finish_reason,
            "stop_reason": output.stop_reason,
        }
        for output in final.outputs
    ]
    return header.body(choices, usage=usage_body([request.prompt], [final]))


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
    finals: list[RequestOutput] = []
    merged = merge_outputs(generations)
    try:
        async for _, output in merged:
            raise_if_failed(output)
            if output.finished:
                finals.append(output)
            for completion in output.outputs:
                sent = progress[completion.index]
                entries = sent.new_logprobs(completion)
                if not sent.has_news(completion, entries):
                    continue
                logprobs = None
                if request.num_top_logprobs is not None:
                    logprobs = chat_logprobs(entries, state.token_texts)
                delta = {"content": completion.delta_text} if completion.delta_text else {}
                chunk = _choice(completion.index, delta, logprobs, completion.finish_reason)
                yield sse_event(header.body([chunk], **extra))
    finally:
        await merged.aclose()
    if request.stream.include_usage:
        yield sse_event(header.body([], usage=usage_body([request.prompt], finals)))


def _choice(
    index: int, delta: dict[str, str], logprobs: dict[str, Any] | None, finish_reason: str | None
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
