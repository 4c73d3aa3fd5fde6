"""OpenAI's Responses API: ``POST /v1/responses`` (whole or streamed), ``GET`` and ``DELETE
/v1/responses/{id}`` (stored responses), over the chat route's prompt, grammar and parsers."""

from __future__ import annotations

from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metrale_server.api.chat import choice_reader
from metrale_server.api.errors import ApiError
from metrale_server.api.fields import parse_json_object
from metrale_server.api.generation import close_all, final_outputs, start_generations
from metrale_server.api.responses import raise_if_failed
from metrale_server.api.responses_protocol import (
    ResponsesRequest,
    parse_responses_request,
    renamed,
)
from metrale_server.api.responses_store import StoredResponse
from metrale_server.api.responses_stream import (
    Sequencer,
    response_events,
)
from metrale_server.api.responses_wire import (
    ResponseHeader,
    function_call_item,
    is_incomplete,
    message_item,
    new_id,
    reasoning_item,
)
from metrale_server.api.state import ServerState
from metrale_server.api.streaming import EventStreamResponse
from metrale_server.api.structured_fields import compile_structured
from metrale_server.output.outputs import RequestOutput


async def create_response(request: Request, *, state: ServerState) -> Response:
    raw = await request.body()
    parsed = await state.preparer.run(
        lambda: parse_responses_request(
            parse_json_object(raw),
            state.engine,
            state.served_model_name,
            store=state.response_store,
            tool_call_parser=state.tool_call_parser,
            image_limits=state.image_limits,
        )
    )
    try:
        grammar = await compile_structured(
            lambda: state.engine.grammar_compiler, parsed.chat.structured, state.preparer
        )
    except ApiError as error:
        raise renamed(error) from error
    header = ResponseHeader.new(
        state.served_model_name, parsed.echo, len(parsed.chat.prompt.token_ids)
    )
    generations = start_generations(state, header.id, [parsed.chat.prompt], grammar)
    if parsed.chat.stream.is_streamed:
        sequencer = Sequencer()
        return EventStreamResponse(
            response_events(state, parsed, generations, header, sequencer),
            on_close=partial(close_all, generations),
            error_frame=sequencer.error_frame,
            end=None,
        )
    [final] = await final_outputs(generations, request.receive)
    body = response_body(state, parsed, final, header)
    if parsed.store:
        state.response_store.put(
            StoredResponse(
                body=body, input_items=parsed.input_items, output_items=tuple(body["output"])
            )
        )
    return JSONResponse(body)


async def get_response(request: Request, *, state: ServerState) -> Response:
    return JSONResponse(_stored(request, state).body)


async def delete_response(request: Request, *, state: ServerState) -> Response:
    response_id = _stored(request, state).body["id"]
    state.response_store.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def _stored(request: Request, state: ServerState) -> StoredResponse:
    response_id = request.path_params["response_id"]
    stored = state.response_store.get(response_id)
    if stored is None:
        raise ApiError(
            404,
            f"no stored response has the id {response_id!r}",
            param="response_id",
            code="not_found",
        )
    return stored


def response_body(
    state: ServerState, request: ResponsesRequest, final: RequestOutput, header: ResponseHeader
) -> dict[str, Any]:
    """The whole response: a reasoning item, the message, then a function_call item per call
    (the message, empty, when there is nothing else)."""
    raise_if_failed(final)
    [output] = final.outputs
    message = choice_reader(state, request.chat).read(output.text)
    status = "incomplete" if is_incomplete(output) else "completed"
    items: list[dict[str, Any]] = []
    if message.reasoning:
        items.append(reasoning_item(new_id("rs"), message.reasoning))
    if message.content or not (message.reasoning or message.calls):
        items.append(message_item(new_id("msg"), message.content or "", status))
    for call in message.calls:
        items.append(function_call_item(new_id("fc"), new_id("call"), call.name, call.arguments))
    return header.body(
        items,
        status=status,
        num_output_tokens=len(output.token_ids),
        num_cached_tokens=final.num_cached_tokens,
    )
