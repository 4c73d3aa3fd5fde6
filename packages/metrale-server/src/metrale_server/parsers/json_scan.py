"""``JsonScanner``: one JSON value read from a text that is still growing.

The scanner is resumable: each ``advance`` reads only what was added since the last one, so
following a value as it streams costs time linear in its length. It checks the whole JSON
grammar (strings with their escapes and no raw control characters, numbers, literals, the
nesting of objects and arrays), so a value it reports ended is one ``json.loads`` accepts
(``NaN`` and ``Infinity``, which Python's reader also takes, are refused). For a top-level
object it also records where each member's value lies, which is what the call readers need.
"""

from __future__ import annotations

import enum
import json
import re

import attrs

_WHITESPACE = re.compile(r"[ \t\r\n]*")
# What ends a run of plain string characters: a quote, an escape, or a control character.
_STRING_STOP = re.compile(r'["\\\x00-\x1f]')
_ESCAPE = re.compile(r'\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})')
_PARTIAL_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{0,3})?")
# A number or a literal runs to the next delimiter; it is checked once it is whole.
_TOKEN = re.compile(r'[^ \t\r\n,:\[\]{}"]+')
_SCALAR = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null")


class _Expect(enum.Enum):
    VALUE = enum.auto()
    VALUE_OR_CLOSE = enum.auto()  # just after "["
    KEY = enum.auto()
    KEY_OR_CLOSE = enum.auto()  # just after "{"
    COLON = enum.auto()
    COMMA_OR_CLOSE = enum.auto()
    DONE = enum.auto()


_VALUE_STARTS = (_Expect.VALUE, _Expect.VALUE_OR_CLOSE)
_KEY_STARTS = (_Expect.KEY, _Expect.KEY_OR_CLOSE)


@attrs.define
class Member:
    """A member of the top-level object: its decoded key, where the key's string starts, and
    its value's span once known (``value_start`` when its first character is read,
    ``value_end``, exclusive, once it is complete)."""

    key: str
    key_start: int
    value_start: int | None = None
    value_end: int | None = None


class JsonScanner:
    """Reads the JSON value at ``text[start]`` (its first character, not whitespace).

    After ``advance(text, is_final=...)``, where each ``text`` extends the previous one:
    ``end`` is the value's end (exclusive) once it is complete; ``failed_at`` is where the
    text stopped being JSON (the end of the text when ``is_final`` and the value is not
    complete). Text after the value is not read.
    """

    def __init__(self, start: int) -> None:
        self.end: int | None = None
        self.failed_at: int | None = None
        self.members: list[Member] = []
        self._position = start
        self._stack: list[str] = []
        self._expect = _Expect.VALUE
        self._string_start: int | None = None  # set while inside a string
        self._string_is_key = False

    @property
    def is_settled(self) -> bool:
        return self.end is not None or self.failed_at is not None

    def advance(self, text: str, *, is_final: bool) -> None:
        if self.is_settled:
            return
        self._position = self._scan(text, self._position, is_final=is_final)
        if is_final and not self.is_settled:
            self.failed_at = len(text)

    def _scan(self, text: str, position: int, *, is_final: bool) -> int:
        """Reads from ``position``; returns where to resume (a token's start while it may
        still grow)."""
        length = len(text)
        while position < length and not self.is_settled:
            if self._string_start is not None:
                stop = _STRING_STOP.search(text, position)
                if stop is None:
                    return length
                at = stop.start()
                if text[at] == '"':
                    position = at + 1
                    self._string_done(text, position)
                    continue
                if text[at] == "\\":
                    escape = _ESCAPE.match(text, at)
                    if escape is not None:
                        position = escape.end()
                        continue
                    if not is_final and _PARTIAL_ESCAPE.fullmatch(text, at):
                        return at
                self.failed_at = at  # a bad escape or a raw control character
                return at
            char = text[position]
            if char in " \t\r\n":
                position = _WHITESPACE.match(text, position).end()  # type: ignore[union-attr]
            elif char == '"':
                position = self._open_string(position)
            elif char in "{[":
                position = self._open_container(char, position)
            elif char in "}]":
                position = self._close_container(char, position)
            elif char == ":":
                position = self._punctuation(_Expect.COLON, position)
            elif char == ",":
                position = self._punctuation(_Expect.COMMA_OR_CLOSE, position)
            else:
                token_end = _TOKEN.match(text, position).end()  # type: ignore[union-attr]
                if token_end == length and not is_final:
                    return position  # the number may go on
                if self._expect not in _VALUE_STARTS or not _SCALAR.fullmatch(
                    text, position, token_end
                ):
                    self.failed_at = position
                    return position
                self._value_started(position)
                position = token_end
                self._value_done(position)
        return position

    def _open_string(self, position: int) -> int:
        if self._expect in _VALUE_STARTS:
            self._string_is_key = False
            self._value_started(position)
        elif self._expect in _KEY_STARTS:
            self._string_is_key = True
        else:
            self.failed_at = position
            return position
        self._string_start = position
        return position + 1

    def _string_done(self, text: str, end: int) -> None:
        start, self._string_start = self._string_start, None
        assert start is not None
        if not self._string_is_key:
            self._value_done(end)
            return
        if self._stack == ["{"]:
            self.members.append(Member(key=json.loads(text[start:end]), key_start=start))
        self._expect = _Expect.COLON

    def _open_container(self, char: str, position: int) -> int:
        if self._expect not in _VALUE_STARTS:
            self.failed_at = position
            return position
        self._value_started(position)
        self._stack.append(char)
        self._expect = _Expect.KEY_OR_CLOSE if char == "{" else _Expect.VALUE_OR_CLOSE
        return position + 1

    def _close_container(self, char: str, position: int) -> int:
        if char == "}":
            opener, just_opened = "{", _Expect.KEY_OR_CLOSE
        else:
            opener, just_opened = "[", _Expect.VALUE_OR_CLOSE
        if (
            not self._stack
            or self._stack[-1] != opener
            or self._expect not in (just_opened, _Expect.COMMA_OR_CLOSE)
        ):
            self.failed_at = position
            return position
        self._stack.pop()
        self._value_done(position + 1)
        return position + 1

    def _punctuation(self, expected: _Expect, position: int) -> int:
        if self._expect is not expected:
            self.failed_at = position
            return position
        if expected is _Expect.COLON:
            self._expect = _Expect.VALUE
        else:
            self._expect = _Expect.KEY if self._stack[-1] == "{" else _Expect.VALUE
        return position + 1

    def _value_started(self, position: int) -> None:
        if self._stack == ["{"]:
            self.members[-1].value_start = position

    def _value_done(self, end: int) -> None:
        if not self._stack:
            self.end = end
            self._expect = _Expect.DONE
            return
        self._expect = _Expect.COMMA_OR_CLOSE
        if self._stack == ["{"]:
            self.members[-1].value_end = end
