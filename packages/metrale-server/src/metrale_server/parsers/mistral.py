"""``mistral``: content, then ``[TOOL_CALLS]`` and either a JSON array of
``{"name", "arguments"}`` (v3 tokenizers) or, repeated per call, ``name[ARGS]{...}`` (v11+)."""

from __future__ import annotations

from metrale_server.parsers.call_array import scan_call_array
from metrale_server.parsers.json_scan import skip_whitespace, value_end
from metrale_server.parsers.tool_stream import (
    BROKEN_CALL,
    PartialCall,
    Scan,
    ScannedToolCallParser,
    held_back,
    is_json,
)

MARKER = "[TOOL_CALLS]"
ARGS = "[ARGS]"


class MistralToolCallParser(ScannedToolCallParser):
    def scan(self, text: str, *, is_final: bool) -> Scan:
        first = text.find(MARKER)
        if first < 0:
            if is_final:
                return Scan(content=text, calls=())
            return Scan(content=text[: len(text) - held_back(text, (MARKER,))].rstrip(), calls=())
        content = text[:first].rstrip()
        start = skip_whitespace(text, first + len(MARKER))
        if start >= len(text):
            return Scan(content=text if is_final else content, calls=())
        if text[start] == "[":
            array = scan_call_array(text, start, is_final=is_final)
            trailing = "" if array.end is None else text[array.end :].strip()
            if array.is_broken or (is_final and trailing):
                return _broken(text, first, content, len(array.calls))
            return Scan(content=content, calls=array.calls)
        return _scan_named_calls(text, first, content, is_final=is_final)


def _scan_named_calls(text: str, first: int, content: str, *, is_final: bool) -> Scan:
    calls: list[PartialCall] = []
    position = first
    while True:
        name_start = position + len(MARKER)
        args_marker = text.find(ARGS, name_start)
        if args_marker < 0:
            if is_final:
                return _broken(text, first, content, len(calls))
            return Scan(content=content, calls=tuple(calls))
        name = text[name_start:args_marker].strip()
        if not name or not name.replace("_", "").replace("-", "").replace(".", "").isalnum():
            return _broken(text, first, content, len(calls))
        args_start = skip_whitespace(text, args_marker + len(ARGS))
        args_end = value_end(text, args_start, is_final=is_final)
        if args_end is None:
            if is_final:
                return _broken(text, first, content, len(calls))
            calls.append(PartialCall(name=name, arguments=text[args_start:]))
            return Scan(content=content, calls=tuple(calls))
        if not is_json(text[args_start:args_end]):
            return _broken(text, first, content, len(calls))
        calls.append(PartialCall(name=name, arguments=text[args_start:args_end], is_done=True))
        position = skip_whitespace(text, args_end)
        if position >= len(text):
            return Scan(content=content, calls=tuple(calls))
        if not text.startswith(MARKER, position):
            if not is_final and MARKER.startswith(text[position:]):
                return Scan(content=content, calls=tuple(calls))
            return _broken(text, first, content, len(calls))


def _broken(text: str, first: int, content: str, num_calls: int) -> Scan:
    """Broken calls: everything from the marker on is content."""
    whole = "\n".join(part for part in (content, text[first:].strip()) if part)
    return Scan(content=whole, calls=(BROKEN_CALL,) * num_calls)
