"""``glm45``: GLM-4.5/4.6 and GLM-5 write a call's name, then its arguments as key/value tags:
``<tool_call>name\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>``.

A value that parses as JSON is that value, anything else a string; the arguments are sent
whole, as JSON, once the block closes.
"""

from __future__ import annotations

import json
import re
from typing import Any

from metrale_server.parsers.tagged_blocks import scan_tagged_blocks
from metrale_server.parsers.tool_stream import PartialCall, Scan, ScannedToolCallParser

_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_NAME_END = re.compile(r"\n|<arg_key>")


class Glm45ToolCallParser(ScannedToolCallParser):
    def scan(self, text: str, *, is_final: bool) -> Scan:
        return scan_tagged_blocks(text, is_final=is_final, read_block=_read_block)


def _read_block(inner: str, is_closed: bool) -> PartialCall | None:
    name_end = _NAME_END.search(inner)
    if name_end is None:
        if not is_closed:
            return None
        name, rest = inner.strip(), ""
    else:
        name, rest = inner[: name_end.start()].strip(), inner[name_end.start() :]
    if not name or any(char in name for char in "<>{}\"'"):
        return None
    if not is_closed:
        return PartialCall(name=name, arguments="")
    arguments: dict[str, Any] = {}
    position = 0
    for match in _PAIR.finditer(rest):
        if rest[position : match.start()].strip():
            return None
        arguments[match.group(1).strip()] = _value(match.group(2))
        position = match.end()
    if rest[position:].strip():
        return None
    return PartialCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False), is_done=True)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
