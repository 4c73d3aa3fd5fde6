"""Where a JSON value ends in text that may still be growing (string- and escape-aware)."""

from __future__ import annotations

import re

import attrs

_SCALAR = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
_WHITESPACE = " \t\r\n"


def skip_whitespace(text: str, start: int) -> int:
    while start < len(text) and text[start] in _WHITESPACE:
        start += 1
    return start


def value_end(text: str, start: int, *, is_final: bool) -> int | None:
    """The end (exclusive) of the JSON value at ``text[start]``; ``None`` while it may still
    continue (an object, array or string not closed yet; a number at the end of the text).
    Brackets are only counted, not checked: a broken value shows when it is decoded."""
    if start >= len(text):
        return None
    first = text[start]
    if first == '"':
        return _string_end(text, start)
    if first in "{[":
        depth, index = 0, start
        while index < len(text):
            char = text[index]
            if char == '"':
                end = _string_end(text, index)
                if end is None:
                    return None
                index = end
                continue
            if char in "{[":
                depth += 1
            elif char in "}]":
                depth -= 1
                if depth == 0:
                    return index + 1
            index += 1
        return None
    match = _SCALAR.match(text, start)
    if match is None or (match.end() == len(text) and not is_final):
        return None
    return match.end()


def _string_end(text: str, start: int) -> int | None:
    index = start + 1
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == '"':
            return index + 1
        index += 1
    return None


@attrs.frozen
class CallObjectScan:
    """A ``{"name": ..., "arguments": ...}`` object read so far: ``name`` once the name and the
    arguments key are written; ``arguments`` the argument text so far; ``end`` once it closes."""

    name: str | None
    arguments: str
    arguments_done: bool
    end: int | None


_NAME_FIRST = re.compile(
    r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)


def scan_call_object(text: str, start: int, *, is_final: bool) -> CallObjectScan:
    """Read the call object at ``text[start]`` (``{``). The name and the argument text are
    streamed only when the name comes first, as every supported model writes it; any other
    order is read whole once the object closes."""
    end = value_end(text, start, is_final=is_final)
    match = _NAME_FIRST.match(text, start)
    if match is None:
        return CallObjectScan(name=None, arguments="", arguments_done=False, end=end)
    name = _decode_string(match.group(1))
    arguments_start = match.end()
    arguments_end = value_end(text, arguments_start, is_final=is_final)
    if arguments_end is None:
        return CallObjectScan(
            name=name, arguments=text[arguments_start:], arguments_done=False, end=end
        )
    return CallObjectScan(
        name=name, arguments=text[arguments_start:arguments_end], arguments_done=True, end=end
    )


def _decode_string(literal: str) -> str | None:
    import json

    try:
        value = json.loads(literal)
    except ValueError:
        return None
    return value if isinstance(value, str) else None
