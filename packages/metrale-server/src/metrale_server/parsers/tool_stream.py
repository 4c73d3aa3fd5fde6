"""``ScannedToolCallParser``: one scan of the text so far serves whole and streamed parsing.

A format implements ``scan(text, is_final)``: the content and the calls readable from ``text``
so far, where each reading only ever grows as text is added (content is held back while it may
still turn out to be a marker; argument text is only what surely belongs to the arguments).
``parse`` is the scan of the whole text; ``feed`` sends what the scan of the text so far adds
to what was sent. So for any split into deltas, the streamed content and argument fragments
concatenate to what ``parse`` returns. The one exception is a call found broken only after
part of it was streamed (a name and some arguments): ``parse`` returns its text as content,
the stream cannot take back what it sent and sends that text as content too.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod

import attrs

from metrale_server.parsers.types import ParsedToolCalls, StreamDelta, ToolCall, ToolCallDelta


@attrs.frozen
class PartialCall:
    """A call as far as it is known: ``name`` once known, the argument text so far, whether
    it is complete, and whether it turned out broken (its text is then content)."""

    name: str | None
    arguments: str
    is_done: bool = False
    is_broken: bool = False


BROKEN_CALL = PartialCall(name=None, arguments="", is_done=True, is_broken=True)


@attrs.frozen
class Scan:
    content: str
    calls: tuple[PartialCall, ...]


class ScannedToolCallParser(ABC):
    """Base of the tool-call parsers; one instance per output (``feed`` keeps its state)."""

    def __init__(self) -> None:
        self._text = ""
        self._content_sent = 0
        # Scan position of each call streamed so far -> [stream index, argument chars sent].
        self._announced: dict[int, list[int]] = {}

    @abstractmethod
    def scan(self, text: str, *, is_final: bool) -> Scan: ...

    def parse(self, text: str) -> ParsedToolCalls:
        scan = self.scan(text, is_final=True)
        calls = tuple(
            ToolCall(name=call.name, arguments=call.arguments)
            for call in scan.calls
            if call.name is not None and not call.is_broken
        )
        return ParsedToolCalls(content=scan.content or None, calls=calls)

    def feed(self, delta: str, *, is_final: bool) -> StreamDelta:
        self._text += delta
        scan = self.scan(self._text, is_final=is_final)
        content = scan.content[self._content_sent :]
        self._content_sent = max(self._content_sent, len(scan.content))
        deltas = []
        for position, call in enumerate(scan.calls):
            if call.is_broken:
                continue
            if call.name is None:
                break
            if position not in self._announced:
                index = len(self._announced)
                self._announced[position] = [index, len(call.arguments)]
                deltas.append(ToolCallDelta(index=index, name=call.name, arguments=call.arguments))
                continue
            index, sent = self._announced[position]
            if len(call.arguments) > sent:
                self._announced[position][1] = len(call.arguments)
                deltas.append(
                    ToolCallDelta(index=index, name=None, arguments=call.arguments[sent:])
                )
        return StreamDelta(content=content, calls=tuple(deltas))


def held_back(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` could be the start of a marker."""
    longest = 0
    for marker in markers:
        for length in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-length:]):
                longest = length
                break
    return longest


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
