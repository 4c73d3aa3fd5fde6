"""``openai_required``: the output ``tool_choice: "required"`` forces through its grammar, a
JSON array of ``{"name", "parameters"}`` calls. Anything else (an output cut short by
``max_tokens``) is returned as content."""

from __future__ import annotations

from metrale_server.parsers.call_array import scan_call_array
from metrale_server.parsers.json_scan import skip_whitespace
from metrale_server.parsers.tool_stream import BROKEN_CALL, Scan, ScannedToolCallParser


class RequiredArrayParser(ScannedToolCallParser):
    def scan(self, text: str, *, is_final: bool) -> Scan:
        start = skip_whitespace(text, 0)
        if start >= len(text):
            return Scan(content=text if is_final else "", calls=())
        if text[start] != "[":
            return Scan(content=text, calls=())
        array = scan_call_array(text, start, is_final=is_final)
        trailing = "" if array.end is None else text[array.end :].strip()
        if array.is_broken or (is_final and trailing):
            return Scan(content=text, calls=(BROKEN_CALL,) * len(array.calls))
        return Scan(content="", calls=array.calls)
