"""Tool calls read from a model's output: whole (``ParsedToolCalls``) or streamed
(``StreamDelta``), and the protocol every tool-call parser follows."""

from __future__ import annotations

from typing import Protocol

import attrs


@attrs.frozen
class ToolCall:
    """``arguments`` is the JSON text of the arguments object: the span the model wrote
    (so streamed fragments concatenate to it), or, for formats that do not write JSON
    (``glm45``), the JSON built from what it wrote."""

    name: str
    arguments: str


@attrs.frozen
class ParsedToolCalls:
    """``content`` is the text outside the calls, ``None`` when that is empty or only
    whitespace."""

    content: str | None
    calls: tuple[ToolCall, ...]


@attrs.frozen
class ToolCallDelta:
    """A piece of call ``index`` (its place among this output's streamed calls). ``name`` is
    set exactly once, in the call's first delta, which comes before any other delta of it;
    ``arguments`` is the next fragment of the arguments (possibly ``""``)."""

    index: int
    name: str | None
    arguments: str


@attrs.frozen
class StreamDelta:
    """What one ``feed`` adds: new content text (``""`` when none) and call pieces."""

    content: str
    calls: tuple[ToolCallDelta, ...]


class ToolCallParser(Protocol):
    """Reads one output (make one per output: ``feed`` keeps the stream's state).

    ``parse(text)`` reads a whole output; it does not touch the stream's state.
    ``feed(delta, is_final=...)`` reads an output arriving in pieces of any size, ``is_final``
    on the last one (after which nothing more may be fed). For any split of a text into
    deltas, the streamed content concatenates to ``parse(text).content or ""`` and the
    streamed calls' names and argument fragments to its calls, except for a call found
    malformed after its name was streamed (see ``metrale_server.parsers``).
    """

    def parse(self, text: str) -> ParsedToolCalls: ...

    def feed(self, delta: str, *, is_final: bool) -> StreamDelta: ...
