"""``glm45``: GLM-4.5/4.6 (and GLM-4.7/5, which leave out the newlines) write a call's name,
then its arguments as key/value tags::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

The name runs to the first whitespace or tag. Keys are stripped. A value whose text is JSON
(its first non-whitespace character may start a JSON value and it decodes, ``NaN`` and
infinities excepted) is that value; any other value is the string exactly as written. The
arguments are the JSON object of the pairs in their order, as ``json.dumps(dict,
ensure_ascii=False)`` writes it (a key written twice stays twice; JSON readers keep the last).

Streamed, the name is announced at the first ``<arg_key>`` (or the closing tag), each pair is
sent once its value closes, and a value that is surely a string (its first non-whitespace
character cannot start JSON: code, prose) streams as it is written.
"""

from __future__ import annotations

import enum
import json
import re

from metrale_server.parsers.machine import Machine, MachineToolCallParser
from metrale_server.parsers.output import Output
from metrale_server.parsers.reading import Status, held_back, may_become, skip_whitespace
from metrale_server.parsers.tagged_blocks import CLOSE, TaggedBlockMachine

KEY_OPEN = "<arg_key>"
KEY_CLOSE = "</arg_key>"
VALUE_OPEN = "<arg_value>"
VALUE_CLOSE = "</arg_value>"

_NAME = re.compile(r"[^\s<>]+")
_VALID_NAME = re.compile(r"[\w.:\-]+")
_JSON_START = frozenset('{["-0123456789tfn')


class _Phase(enum.Enum):
    NAME = enum.auto()
    BETWEEN = enum.auto()  # after the name or a pair: a key, or the end of the block
    KEY = enum.auto()
    AFTER_KEY = enum.auto()
    VALUE = enum.auto()


class Glm45Block:
    """A ``BlockReader`` and the ``CallReader`` of its call."""

    def __init__(self, start: int) -> None:
        self.status = Status.PARTIAL
        self.end = start
        self.name: str | None = None
        self._phase = _Phase.NAME
        self._position = start
        self._search_from = start  # where to look for the closing tag of a key or value
        self._name = ""
        self._pairs = 0
        self._key = ""
        self._value_start = 0
        self._is_string: bool | None = None  # decided by the value's first character
        self._value_sent: int | None = None  # how far a string value was streamed
        self._fragments: list[str] = []

    def read(self, text: str, *, is_final: bool, out: Output) -> None:
        if self.status is not Status.PARTIAL:
            return
        status, end = self._scan(text, is_final=is_final)
        if status is Status.BROKEN:
            out.drop_call()
        else:
            out.follow(self, text)
            if status is Status.DONE:
                out.close_call()
        self.status = status
        self.end = end

    def take_arguments(self, text: str) -> str:
        fragments = "".join(self._fragments)
        self._fragments.clear()
        return fragments

    def _scan(self, text: str, *, is_final: bool) -> tuple[Status, int]:
        while True:
            phase = self._phase
            if phase is _Phase.NAME:
                start = skip_whitespace(text, self._position)
                match = _NAME.match(text, start)
                stop = start if match is None else match.end()
                if stop == len(text):
                    return (Status.BROKEN, stop) if is_final else (Status.PARTIAL, stop)
                if not _VALID_NAME.fullmatch(text, start, stop):
                    return Status.BROKEN, start
                self._name = text[start:stop]
                self._position = stop
                self._phase = _Phase.BETWEEN
            elif phase is _Phase.BETWEEN:
                position = skip_whitespace(text, self._position)
                if text.startswith(KEY_OPEN, position):
                    self.name = self._name
                    self._position = self._search_from = position + len(KEY_OPEN)
                    self._phase = _Phase.KEY
                    continue
                block_end = -1
                if text.startswith(CLOSE, position):
                    block_end = position + len(CLOSE)
                elif position == len(text) and is_final:
                    block_end = position  # the output stopped before the closing tag
                if block_end >= 0:
                    self.name = self._name
                    self._fragments.append("}" if self._pairs else "{}")
                    return Status.DONE, block_end
                if not is_final and (
                    may_become(text, position, KEY_OPEN) or may_become(text, position, CLOSE)
                ):
                    return Status.PARTIAL, position
                return Status.BROKEN, position
            elif phase is _Phase.KEY:
                found = text.find(KEY_CLOSE, self._search_from)
                if found < 0:
                    return self._wait(text, KEY_CLOSE, is_final=is_final)
                self._key = text[self._position : found].strip()
                self._position = found + len(KEY_CLOSE)
                self._phase = _Phase.AFTER_KEY
            elif phase is _Phase.AFTER_KEY:
                position = skip_whitespace(text, self._position)
                if text.startswith(VALUE_OPEN, position):
                    self._value_start = self._position = self._search_from = position + len(
                        VALUE_OPEN
                    )
                    self._is_string = None
                    self._value_sent = None
                    self._phase = _Phase.VALUE
                    continue
                if not is_final and may_become(text, position, VALUE_OPEN):
                    return Status.PARTIAL, position
                return Status.BROKEN, position
            else:
                found = text.find(VALUE_CLOSE, self._search_from)
                if self._is_string is None:
                    first = skip_whitespace(text, self._value_start)
                    if first < (len(text) if found < 0 else found):
                        self._is_string = text[first] not in _JSON_START
                if found < 0:
                    if self._is_string and not is_final:
                        held = held_back(text, self._value_start, VALUE_CLOSE)
                        self._stream_string(text, len(text) - held)
                    return self._wait(text, VALUE_CLOSE, is_final=is_final)
                if self._is_string:
                    self._stream_string(text, found)
                    self._fragments.append('"')
                else:
                    value = _encode_value(text[self._value_start : found])
                    self._fragments.append(self._pair_prefix() + value)
                self._pairs += 1
                self._position = found + len(VALUE_CLOSE)
                self._phase = _Phase.BETWEEN

    def _wait(self, text: str, tag: str, *, is_final: bool) -> tuple[Status, int]:
        """The closing ``tag`` of a key or value is not in the text yet."""
        if is_final:
            return Status.BROKEN, len(text)
        self._search_from = max(self._search_from, len(text) - len(tag) + 1)
        return Status.PARTIAL, len(text)

    def _stream_string(self, text: str, stop: int) -> None:
        if self._value_sent is None:
            self._fragments.append(self._pair_prefix() + '"')
            self._value_sent = self._value_start
        if stop > self._value_sent:
            # JSON escapes one character at a time, so escaped pieces join to the whole.
            self._fragments.append(
                json.dumps(text[self._value_sent : stop], ensure_ascii=False)[1:-1]
            )
            self._value_sent = stop

    def _pair_prefix(self) -> str:
        return (
            ("{" if self._pairs == 0 else ", ") + json.dumps(self._key, ensure_ascii=False) + ": "
        )


def _encode_value(raw: str) -> str:
    first = skip_whitespace(raw, 0)
    if first < len(raw) and raw[first] in _JSON_START:
        try:
            return json.dumps(json.loads(raw), ensure_ascii=False, allow_nan=False)
        except (ValueError, RecursionError):
            pass
    return json.dumps(raw, ensure_ascii=False)


class Glm45ToolCallParser(MachineToolCallParser):
    def new_machine(self) -> Machine:
        return TaggedBlockMachine(Glm45Block)
