"""``llama3_json``: Llama 3.1/3.2 answer a call with the JSON object itself,
``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``), several joined
by ``; ``. An output that does not start with ``{`` is content; one whose calls are broken is
returned whole as content."""

from __future__ import annotations

from metrale_server.parsers.json_scan import scan_call_object, skip_whitespace
from metrale_server.parsers.tool_stream import (
    BROKEN_CALL,
    PartialCall,
    Scan,
    ScannedToolCallParser,
    is_json,
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolCallParser(ScannedToolCallParser):
    def scan(self, text: str, *, is_final: bool) -> Scan:
        start = skip_whitespace(text, 0)
        if text.startswith(PYTHON_TAG, start):
            start = skip_whitespace(text, start + len(PYTHON_TAG))
        elif not is_final and PYTHON_TAG.startswith(text[start:]):
            return Scan(content="", calls=())  # may still become the tag
        if start >= len(text):
            return Scan(content=text if is_final else "", calls=())
        if text[start] != "{":
            return Scan(content=text, calls=())
        calls: list[PartialCall] = []
        position = start
        while True:
            scan = scan_call_object(text, position, is_final=is_final)
            if scan.end is None:
                if is_final:
                    break  # broken
                if scan.name is not None:
                    calls.append(PartialCall(name=scan.name, arguments=scan.arguments))
                return Scan(content="", calls=tuple(calls))
            if (
                scan.name is None
                or not scan.arguments_done
                or not is_json(text[position : scan.end])
            ):
                break
            calls.append(PartialCall(name=scan.name, arguments=scan.arguments, is_done=True))
            position = skip_whitespace(text, scan.end)
            if position >= len(text):
                if is_final:
                    return Scan(content="", calls=tuple(calls))
                return Scan(content="", calls=tuple(calls))
            if text[position] != ";":
                break
            position = skip_whitespace(text, position + 1)
            if position >= len(text):
                if is_final:
                    break
                return Scan(content="", calls=tuple(calls))
            if text[position] != "{":
                break
        return Scan(content=text, calls=(BROKEN_CALL,) * max(len(calls), 1))
