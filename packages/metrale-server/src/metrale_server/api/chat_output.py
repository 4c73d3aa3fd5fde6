"""A chat choice's text → the assistant message: reasoning, content and tool calls.

The text goes through the server's ``--reasoning-parser`` first (``<think>`` … into
``reasoning_content``), then the rest through the reader the request's tool choice needs:
``auto``, the server's ``--tool-call-parser``; ``required``, the JSON array of calls its grammar
forced; a named function, whose grammar forced its arguments (the whole content is them).
Streamed, the same readers run on each delta, so the deltas concatenate to the whole message.
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs

from metrale_server.api.tool_fields import ToolRequest
from metrale_server.parsers import (
    REQUIRED_CALLS_PARSER,
    ParsedToolCalls,
    ReasoningParser,
    StreamDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    make_reasoning_parser,
    make_tool_call_parser,
)


class NamedCallReader:
    """``tool_choice`` naming a function: the grammar made the whole output its arguments."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._is_started = False

    def parse(self, text: str) -> ParsedToolCalls:
        return ParsedToolCalls(content=None, calls=(ToolCall(name=self.name, arguments=text),))

    def feed(self, delta: str, *, is_final: bool) -> StreamDelta:
        if self._is_started and not delta:
            return StreamDelta(content="", calls=())
        name = None if self._is_started else self.name
        self._is_started = True
        return StreamDelta(content="", calls=(ToolCallDelta(index=0, name=name, arguments=delta),))


@attrs.frozen(kw_only=True)
class ChatMessage:
    reasoning: str | None
    content: str | None
    calls: tuple[ToolCall, ...]


@attrs.frozen(kw_only=True)
class ChatDelta:
    reasoning: str
    content: str
    calls: tuple[ToolCallDelta, ...]


class ChoiceReader:
    """Reads one choice's text, whole (``read``) or as it streams (``feed``); one per choice."""

    def __init__(
        self, reasoning: ReasoningParser | None, tools: ToolCallParser | NamedCallReader | None
    ) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self.call_ids: list[str] = []

    @classmethod
    def for_request(
        cls,
        tools: ToolRequest,
        *,
        tool_call_parser: str | None,
        reasoning_parser: str | None,
        is_json_constrained: bool = False,
    ) -> ChoiceReader:
        """The readers a request's choices go through. A JSON grammar (a schema, a JSON object,
        a forced tool call) holds from the first token, so such an output has no reasoning
        block and skips the reasoning parser (a grammar that starts after the reasoning, as
        vLLM's reasoning-aware structured outputs do, is not built)."""
        reader: ToolCallParser | NamedCallReader | None = None
        if tools.choice == "named":
            assert tools.named is not None
            reader = NamedCallReader(tools.named)
        elif tools.choice == "required":
            reader = make_tool_call_parser(REQUIRED_CALLS_PARSER)
        elif tools.choice == "auto":
            assert tool_call_parser is not None  # the request parser refused auto without one
            reader = make_tool_call_parser(tool_call_parser)
        reasoning = None
        if reasoning_parser is not None and not is_json_constrained:
            reasoning = make_reasoning_parser(reasoning_parser)
        return cls(reasoning, reader)

    def read(self, text: str) -> ChatMessage:
        reasoning: str | None = None
        content: str | None = text
        if self._reasoning is not None:
            split = self._reasoning.parse(text)
            reasoning, content = split.reasoning, split.content
        if self._tools is None or not content:
            return ChatMessage(reasoning=reasoning, content=content, calls=())
        parsed = self._tools.parse(content)
        return ChatMessage(reasoning=reasoning, content=parsed.content, calls=parsed.calls)

    def feed(self, delta: str, *, is_final: bool) -> ChatDelta:
        reasoning, content = "", delta
        if self._reasoning is not None:
            split = self._reasoning.feed(delta, is_final=is_final)
            reasoning, content = split.reasoning or "", split.content or ""
        if self._tools is None:
            return ChatDelta(reasoning=reasoning, content=content, calls=())
        streamed = self._tools.feed(content, is_final=is_final)
        return ChatDelta(reasoning=reasoning, content=streamed.content, calls=streamed.calls)

    def call_id(self, index: int) -> str:
        """The id of call ``index`` of this choice, the same whenever it is asked for."""
        while len(self.call_ids) <= index:
            self.call_ids.append(f"call_{uuid.uuid4().hex[:24]}")
        return self.call_ids[index]


def message_body(reader: ChoiceReader, message: ChatMessage) -> dict[str, Any]:
    body: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.reasoning is not None:
        body["reasoning_content"] = message.reasoning
    if message.calls:
        body["tool_calls"] = [
            {
                "id": reader.call_id(index),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for index, call in enumerate(message.calls)
        ]
    return body


def delta_body(reader: ChoiceReader, delta: ChatDelta) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if delta.reasoning:
        body["reasoning_content"] = delta.reasoning
    if delta.content:
        body["content"] = delta.content
    if delta.calls:
        body["tool_calls"] = [_call_delta(reader, call) for call in delta.calls]
    return body


def _call_delta(reader: ChoiceReader, call: ToolCallDelta) -> dict[str, Any]:
    if call.name is None:
        return {"index": call.index, "function": {"arguments": call.arguments}}
    return {
        "index": call.index,
        "id": reader.call_id(call.index),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def finish_reason(tools: ToolRequest, reason: str | None, has_calls: bool) -> str | None:
    """OpenAI's ``tool_calls`` when the model stopped after calling tools it chose to call;
    a named function's call ends as ``stop``, as OpenAI ends it."""
    if reason == "stop" and has_calls and tools.choice in ("auto", "required"):
        return "tool_calls"
    return reason
