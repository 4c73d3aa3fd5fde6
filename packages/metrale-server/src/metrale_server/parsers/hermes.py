"""``hermes``: Qwen2.5/Qwen3 and Hermes models write each call as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``."""

from __future__ import annotations

from metrale_server.parsers.json_scan import scan_call_object, skip_whitespace
from metrale_server.parsers.tagged_blocks import scan_tagged_blocks
from metrale_server.parsers.tool_stream import PartialCall, Scan, ScannedToolCallParser, is_json


class HermesToolCallParser(ScannedToolCallParser):
    def scan(self, text: str, *, is_final: bool) -> Scan:
        return scan_tagged_blocks(text, is_final=is_final, read_block=_read_block)


def _read_block(inner: str, is_closed: bool) -> PartialCall | None:
    start = skip_whitespace(inner, 0)
    scan = scan_call_object(inner, start, is_final=is_closed)
    if is_closed:
        is_whole = (
            scan.end is not None
            and scan.arguments_done
            and not inner[scan.end :].strip()
            and is_json(inner[start : scan.end])
        )
        if not is_whole or scan.name is None:
            return None
    if scan.name is None:
        return None
    return PartialCall(name=scan.name, arguments=scan.arguments, is_done=is_closed)
