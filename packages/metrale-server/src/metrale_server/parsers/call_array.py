"""A JSON array of call objects, ``[{"name": ..., "arguments" | "parameters": ...}, ...]``,
read as it grows (Mistral's ``[TOOL_CALLS]`` payload, the ``required`` tool choice's output)."""

from __future__ import annotations

import attrs

from metrale_server.parsers.json_scan import scan_call_object, skip_whitespace
from metrale_server.parsers.tool_stream import PartialCall, is_json


@attrs.frozen
class ArrayScan:
    calls: tuple[PartialCall, ...]
    end: int | None  # after the closing bracket, once seen
    is_broken: bool


def scan_call_array(text: str, start: int, *, is_final: bool) -> ArrayScan:
    """The calls of the array at ``text[start]`` (``[``)."""
    calls: list[PartialCall] = []
    position = skip_whitespace(text, start + 1)
    while True:
        if position >= len(text):
            return ArrayScan(calls=tuple(calls), end=None, is_broken=is_final)
        if text[position] == "]" and not calls:
            return ArrayScan(calls=(), end=position + 1, is_broken=True)
        if text[position] != "{":
            return ArrayScan(calls=tuple(calls), end=None, is_broken=True)
        scan = scan_call_object(text, position, is_final=is_final)
        if scan.end is None:
            if scan.name is not None and not is_final:
                calls.append(PartialCall(name=scan.name, arguments=scan.arguments))
            return ArrayScan(calls=tuple(calls), end=None, is_broken=is_final)
        if scan.name is None or not scan.arguments_done or not is_json(text[position : scan.end]):
            return ArrayScan(calls=tuple(calls), end=None, is_broken=True)
        calls.append(PartialCall(name=scan.name, arguments=scan.arguments, is_done=True))
        position = skip_whitespace(text, scan.end)
        if position >= len(text):
            return ArrayScan(calls=tuple(calls), end=None, is_broken=is_final)
        if text[position] == "]":
            return ArrayScan(calls=tuple(calls), end=position + 1, is_broken=False)
        if text[position] != ",":
            return ArrayScan(calls=tuple(calls), end=None, is_broken=True)
        position = skip_whitespace(text, position + 1)
