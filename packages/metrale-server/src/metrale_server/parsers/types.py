"""What the output parsers return: tool calls whole or as stream deltas, reasoning splits."""

from __future__ import annotations

import attrs


@attrs.frozen
class ToolCall:
    """``arguments`` is JSON text: the span the model wrote (so streamed fragments concatenate
    to it), or, for formats that write arguments otherwise, the JSON of what it wrote."""

    name: str
    arguments: str


@attrs.frozen
class ParsedToolCalls:
    """``content`` is the text outside the calls, ``None`` when that is empty."""

    content: str | None
    calls: tuple[ToolCall, ...]


@attrs.frozen
class ToolCallDelta:
    """``name`` comes once, in the first delta of call ``index``, before any argument text."""

    index: int
    name: str | None
    arguments: str


@attrs.frozen
class StreamDelta:
    content: str
    calls: tuple[ToolCallDelta, ...]


@attrs.frozen
class ReasoningSplit:
    """Reasoning and content text; ``None`` (whole) or ``""`` (a delta) when there is none."""

    reasoning: str | None
    content: str | None
