"""Helpers for the parser tests: cutting a text into deltas, and assembling a streamed tool-call
output the way an OpenAI client does (checking the delta contract as it goes)."""

from __future__ import annotations

import itertools

import attrs
from hypothesis import strategies as st

from metrale_server.parsers import ToolCall, ToolCallParser, make_tool_call_parser


def cut(text: str, cuts: list[int]) -> list[str]:
    """``text`` cut at ``cuts`` (positions, in any order, repeats allowed: empty deltas)."""
    bounds = [0, *sorted(cuts), len(text)]
    return [text[start:stop] for start, stop in itertools.pairwise(bounds)]


@st.composite
def deltas(draw: st.DrawFn, text: str) -> list[str]:
    """``text`` cut at up to 16 random places (empty deltas included)."""
    return cut(text, draw(st.lists(st.integers(0, len(text)), max_size=16)))


@attrs.frozen
class Streamed:
    content: str
    calls: tuple[ToolCall, ...]


def stream(parser: ToolCallParser | str, pieces: list[str]) -> Streamed:
    """Feeds ``pieces`` (the last one final) and joins the deltas as a client does, checking
    that each call's first delta names it, no other does, and calls arrive in order."""
    if isinstance(parser, str):
        parser = make_tool_call_parser(parser)
    content = ""
    calls: dict[int, list[str]] = {}
    pieces = pieces or [""]
    for number, piece in enumerate(pieces):
        delta = parser.feed(piece, is_final=number == len(pieces) - 1)
        content += delta.content
        for call in delta.calls:
            if call.index not in calls:
                assert call.name is not None, "a call's first delta names it"
                assert call.index == len(calls), "calls arrive in order"
                calls[call.index] = [call.name, ""]
            else:
                assert call.name is None, "the name comes once"
            calls[call.index][1] += call.arguments
    return Streamed(
        content=content, calls=tuple(ToolCall(name=n, arguments=a) for n, a in calls.values())
    )


def is_subsequence(short: tuple[ToolCall, ...], long: tuple[ToolCall, ...]) -> bool:
    remaining = iter(long)
    return all(any(call == other for other in remaining) for call in short)
