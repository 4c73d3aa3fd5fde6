"""``POST /v1/completions``: the legacy text completion, whole or streamed."""

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
from metrale_server.api.logprobs import (
    completion_logprobs,
    echo_logprobs,
    joined_logprobs,
    prompt_logprobs_body,
)
from metrale_server.api.protocol import CompletionRequest, Prompt, parse_completion_request
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


async def create_completion(request: Request, *, state: ServerState) -> Response:
    raw = await request.body()
    parsed = await state.preparer.run(
        lambda: parse_completion_request(
            parse_json_object(raw), state.engine, state.served_model_name
        )
    )
    grammar = await compile_structured(
        lambda: state.engine.grammar_compiler, parsed.structured, state.preparer
    )
    header = ResponseHeader.new(
        id_prefix="cmpl", object="text_completion", model=state.served_model_name
    )
    generations = start_generations(state, header.id, parsed.prompts, grammar)
    if parsed.stream.is_streamed:
        return EventStreamResponse(
            completion_events(state, parsed, generations, header),
            on_close=partial(close_all, generations),
        )
    finals = await final_outputs(generations, request.receive)
    return JSONResponse(completion_body(state, parsed, finals, header))


def echo_text(state: ServerState, prompt: Prompt) -> str:
    if prompt.text is not None:
        return prompt.text
    return state.engine.tokenizer.decode(prompt.token_ids, skip_special_tokens=False)


def completion_body(
    state: ServerState,
    request: CompletionRequest,
    finals: Sequence[RequestOutput],
    header: ResponseHeader,
) -> dict[str, Any]:
    choices = []
    for index, (prompt, final) in enumerate(zip(request.prompts, finals, strict=True)):
        raise_if_failed(final)
        prefix = echo_text(state, prompt) if request.is_echo else ""
        echoed = _echoed_logprobs(state, request, prompt, final)
        prompt_fields = _prompt_logprobs_fields(state, request, final)
        for output in final.outputs:
            logprobs = None
            if request.num_logprobs is not None:
                logprobs = completion_logprobs(
                    output.logprobs or (), state.token_texts, text_offset=len(prefix)
                )
                if echoed is not None:
                    logprobs = joined_logprobs(echoed, logprobs)
            choices.append(
                {
                    "index": index * request.n + output.index,
                    "text": prefix + output.text,
                    "logprobs": logprobs,
                    "finish_reason": output.finish_reason,
                    "stop_reason": output.stop_reason,
                    **prompt_fields,
                }
            )
    return header.body(choices, usage=usage_body(request.prompts, finals))


def _echoed_logprobs(
    state: ServerState, request: CompletionRequest, prompt: Prompt, output: RequestOutput
) -> dict[str, Any] | None:
    """The echoed prompt's logprobs, when echo and logprobs were both asked for."""
    if not request.is_echo or request.num_logprobs is None:
        return None
    assert output.prompt_logprobs is not None  # asked for with the request
    return echo_logprobs(prompt.token_ids, output.prompt_logprobs, state.token_texts)


def _prompt_logprobs_fields(
    state: ServerState, request: CompletionRequest, output: RequestOutput
) -> dict[str, Any]:
    """vLLM's ``prompt_logprobs`` for each of the prompt's choices, when the request asked
    for them (built once per prompt: its ``n`` choices share them)."""
    if request.num_prompt_logprobs is None or output.prompt_logprobs is None:
        return {}
    return {"prompt_logprobs": prompt_logprobs_body(output.prompt_logprobs, state.token_texts)}


async def completion_events(
    state: ServerState,
    request: CompletionRequest,
    generations: Sequence[Generation],
    header: ResponseHeader,
) -> AsyncGenerator[str, None]:
    """One chunk per choice whenever it has new text, logprobs or its finish reason."""
    extra = {"usage": None} if request.stream.include_usage else {}
    progress = [ChoiceProgress() for _ in range(len(request.prompts) * request.n)]
    # With logprobs the echo waits for the prompt's logprobs (the prefill computes them).
    echo_at_once = request.is_echo and request.num_logprobs is None
    if echo_at_once:
        for index, prompt in enumerate(request.prompts):
            prefix = echo_text(state, prompt)
            for choice in range(index * request.n, (index + 1) * request.n):
                progress[choice].text_offset = len(prefix)
                yield sse_event(header.body([_choice(choice, prefix, None, None)], **extra))
    prompt_sent: set[int] = set()  # the prompts whose logprobs chunk was sent
    finals: list[RequestOutput] = []
    merged = merge_outputs(generations)
    try:
        async for index, output in merged:
            raise_if_failed(output)
            if output.finished:
                finals.append(output)
            if index not in prompt_sent and output.prompt_logprobs is not None:
                prompt_sent.add(index)  # one chunk per choice, before its first tokens
                prompt = request.prompts[index]
                echoed_text = echo_text(state, prompt) if request.is_echo else ""
                prefix = "" if echo_at_once else echoed_text
                echoed = _echoed_logprobs(state, request, prompt, output)
                prompt_fields = _prompt_logprobs_fields(state, request, output)
                for choice in range(index * request.n, (index + 1) * request.n):
                    progress[choice].text_offset = len(echoed_text)
                    first = {**_choice(choice, prefix, echoed, None), **prompt_fields}
                    yield sse_event(header.body([first], **extra))
            for completion in output.outputs:
                choice = index * request.n + completion.index
                sent = progress[choice]
                entries = sent.new_logprobs(completion)
                if not sent.has_news(completion, entries):
                    continue
                logprobs = None
                if request.num_logprobs is not None:
                    logprobs = completion_logprobs(
                        entries, state.token_texts, text_offset=sent.text_offset
                    )
                    sent.text_offset += sum(len(token) for token in logprobs["tokens"])
                yield sse_event(
                    header.body(
                        [
                            _choice(
                                choice, completion.delta_text, logprobs, completion.finish_reason
                            )
                        ],
                        **extra,
                    )
                )
    finally:
        await merged.aclose()
    if request.stream.include_usage:
        yield sse_event(header.body([], usage=usage_body(request.prompts, finals)))


def _choice(
    index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str | None
) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
