"""Anthropic's Messages API: ``POST /v1/messages`` (whole or streamed) and
``POST /v1/messages/count_tokens``, over the chat route's prompt, grammar and parsers."""

from __future__ import annotations

from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metrale_server.api.anthropic_protocol import count_message_tokens, parse_messages_request
from metrale_server.api.anthropic_stream import anthropic_error_frame, message_events
from metrale_server.api.anthropic_wire import (
    ContentBlock,
    MessageHeader,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    new_message_id,
    new_tool_use_id,
    stop_reason,
    tool_input,
)
from metrale_server.api.chat import choice_reader
from metrale_server.api.fields import parse_json_object
from metrale_server.api.generation import close_all, final_outputs, start_generations
from metrale_server.api.protocol import ChatRequest
from metrale_server.api.responses import raise_if_failed
from metrale_server.api.state import ServerState
from metrale_server.api.streaming import EventStreamResponse
from metrale_server.api.structured_fields import compile_structured
from metrale_server.output.outputs import RequestOutput


async def create_message(request: Request, *, state: ServerState) -> Response:
    raw = await request.body()
    parsed = await state.preparer.run(
        lambda: parse_messages_request(
            parse_json_object(raw),
            state.engine,
            state.served_model_name,
            tool_call_parser=state.tool_call_parser,
            reasoning_parser=state.reasoning_parser,
            image_limits=state.image_limits,
        )
    )
    grammar = await compile_structured(
        lambda: state.engine.grammar_compiler, parsed.structured, state.preparer
    )
    header = MessageHeader(
        id=new_message_id(),
        model=state.served_model_name,
        num_input_tokens=len(parsed.prompt.token_ids),
    )
    generations = start_generations(state, header.id, [parsed.prompt], grammar)
    if parsed.stream.is_streamed:
        return EventStreamResponse(
            message_events(state, parsed, generations, header),
            on_close=partial(close_all, generations),
            error_frame=anthropic_error_frame,
            end=None,
        )
    [final] = await final_outputs(generations, request.receive)
    return JSONResponse(message_body(state, parsed, final, header))


async def count_tokens(request: Request, *, state: ServerState) -> Response:
    raw = await request.body()
    count = await state.preparer.run(
        lambda: count_message_tokens(
            parse_json_object(raw),
            state.engine,
            state.served_model_name,
            image_limits=state.image_limits,
        )
    )
    return JSONResponse({"input_tokens": count})


def message_body(
    state: ServerState, request: ChatRequest, final: RequestOutput, header: MessageHeader
) -> dict[str, Any]:
    """The whole message: a thinking block, a text block, then a tool_use block per call (a
    call whose arguments are not a JSON object, cut short, is text instead)."""
    raise_if_failed(final)
    [output] = final.outputs
    message = choice_reader(state, request).read(output.text)
    content: list[ContentBlock] = []
    if message.reasoning:
        content.append(ThinkingBlock(message.reasoning))
    if message.content:
        content.append(TextBlock(message.content))
    for call in message.calls:
        arguments = tool_input(call.arguments)
        if arguments is None:
            content.append(TextBlock(call.arguments))
        else:
            content.append(ToolUseBlock(id=new_tool_use_id(), name=call.name, input=arguments))
    has_tool_use = any(isinstance(block, ToolUseBlock) for block in content)
    stop = stop_reason(output, has_tool_use=has_tool_use)
    return header.body(content, stop, len(output.token_ids))
