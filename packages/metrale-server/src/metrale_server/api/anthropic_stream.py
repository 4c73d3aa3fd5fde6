"""A streamed message: Anthropic's events, ``event: <type>\\ndata: {json}\\n\\n`` each.

``message_start`` (the message with no content yet), ``ping``, then per content block
``content_block_start``, its ``content_block_delta``s (``thinking_delta``, ``text_delta``,
``input_json_delta``) and ``content_block_stop``; ``message_delta`` (stop reason, usage) and
``message_stop`` last. A failure mid-stream is an ``error`` event. One block is open at a time,
opened when its first text arrives: reasoning (a thinking block), text, each tool call (a
tool_use block, once the parser knows its name). Text the model writes after a tool call opens
a new text block, which the whole message holds in its one text block (whole messages have at
most one thinking block, then one text block, then the tool_use blocks).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from metrale_server.api.anthropic_wire import (
    MessageHeader,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    new_tool_use_id,
    stop_reason,
)
from metrale_server.api.chat import choice_reader
from metrale_server.api.chat_output import ChatDelta
from metrale_server.api.errors import ApiError
from metrale_server.api.generation import Generation, merge_outputs
from metrale_server.api.protocol import ChatRequest
from metrale_server.api.responses import raise_if_failed
from metrale_server.api.state import ServerState
from metrale_server.api.streaming import sse_event
from metrale_server.output.outputs import CompletionOutput


def named_event(payload: Mapping[str, Any]) -> str:
    """One SSE frame named by the payload's ``type``, as Anthropic frames every event."""
    return sse_event(payload, name=payload["type"])


class BlockStream:
    """One choice's deltas → content block events; one per streamed message."""

    def __init__(self) -> None:
        self._index = -1
        self._open_kind: str | None = None
        self._call_blocks: dict[int, int] = {}  # the parser's call index -> block index

    @property
    def has_tool_use(self) -> bool:
        return bool(self._call_blocks)

    def feed(self, delta: ChatDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if delta.reasoning:
            if self._open_kind != "thinking":
                events += self._start(ThinkingBlock(""))
            events.append(self._delta({"type": "thinking_delta", "thinking": delta.reasoning}))
        if delta.content:
            if self._open_kind != "text":
                events += self._start(TextBlock(""))
            events.append(self._delta({"type": "text_delta", "text": delta.content}))
        for call in delta.calls:
            if call.name is not None:
                events += self._start(ToolUseBlock(id=new_tool_use_id(), name=call.name, input={}))
                self._call_blocks[call.index] = self._index
            index = self._call_blocks.get(call.index)
            if call.arguments and index is not None:
                json_delta = {"type": "input_json_delta", "partial_json": call.arguments}
                events.append(self._delta(json_delta, index))
        return events

    def close(self) -> list[dict[str, Any]]:
        """The open block's stop event, if one is open."""
        if self._open_kind is None:
            return []
        self._open_kind = None
        return [{"type": "content_block_stop", "index": self._index}]

    def _start(self, block: TextBlock | ThinkingBlock | ToolUseBlock) -> list[dict[str, Any]]:
        events = self.close()
        self._index += 1
        self._open_kind = block.to_wire()["type"]
        start = {"type": "content_block_start", "index": self._index}
        return [*events, {**start, "content_block": block.to_wire()}]

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> dict[str, Any]:
        block_index = self._index if index is None else index
        return {"type": "content_block_delta", "index": block_index, "delta": delta}


async def message_events(
    state: ServerState,
    request: ChatRequest,
    generations: Sequence[Generation],
    header: MessageHeader,
) -> AsyncGenerator[str, None]:
    """The events of one generation's message (Anthropic has no ``n``: one output)."""
    yield named_event({"type": "message_start", "message": header.body([], None, 0)})
    yield named_event({"type": "ping"})
    reader = choice_reader(state, request)
    blocks = BlockStream()
    final: CompletionOutput | None = None
    merged = merge_outputs(generations)
    try:
        async for _, output in merged:
            raise_if_failed(output)
            for completion in output.outputs:
                if not (completion.delta_text or completion.finished):
                    continue
                read = reader.feed(completion.delta_text, is_final=completion.finished)
                for event in blocks.feed(read):
                    yield named_event(event)
                if completion.finished:
                    final = completion
    finally:
        await merged.aclose()
    for event in blocks.close():
        yield named_event(event)
    assert final is not None
    stop = stop_reason(final, has_tool_use=blocks.has_tool_use)
    yield named_event(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop.reason, "stop_sequence": stop.sequence},
            "usage": header.usage(len(final.token_ids)),
        }
    )
    yield named_event({"type": "message_stop"})


def anthropic_error_frame(error: ApiError) -> str:
    """A failure mid-stream: an ``error`` event in Anthropic's shape."""
    return named_event(error.to_anthropic_body())
