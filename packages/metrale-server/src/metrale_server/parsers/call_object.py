"""``CallObjectReader``: a ``{"name": "f", "arguments": {...}}`` object read as it grows.

``"parameters"`` is read as ``"arguments"`` (Llama's and the ``required`` grammar's key);
other members (Mistral's ``"id"``) are ignored. The object is well-formed when it is JSON, its
``name`` is a non-empty string, its arguments an object, and neither key is written twice; a
call without arguments gets ``{}``. The arguments are the raw span of their value, streamed
from the moment the name is complete and the arguments' ``{`` is read, whichever member comes
first; with the arguments written before the name, they arrive whole with the name.
"""

from __future__ import annotations

import json

from metrale_server.parsers.json_scan import JsonScanner, Member
from metrale_server.parsers.reading import Status

NAME_KEY = "name"
ARGUMENT_KEYS = ("arguments", "parameters")
NO_ARGUMENTS = "{}"


class CallObjectReader:
    """Reads the call object at ``text[start]`` (``{``); a ``CallReader``."""

    def __init__(self, start: int) -> None:
        self._scanner = JsonScanner(start)
        self.status = Status.PARTIAL
        self.end = start
        self.name: str | None = None
        self._arguments: Member | None = None
        self._taken: int | None = None  # where the next argument fragment starts
        self._gave_default = False

    def read(self, text: str, *, is_final: bool) -> None:
        if self.status is not Status.PARTIAL:
            return
        scanner = self._scanner
        scanner.advance(text, is_final=is_final)
        if scanner.failed_at is not None:
            self._break(scanner.failed_at)
            return
        name_member: Member | None = None
        arguments: Member | None = None
        for member in scanner.members:
            if member.key == NAME_KEY:
                if name_member is not None:
                    self._break(member.key_start)
                    return
                name_member = member
            elif member.key in ARGUMENT_KEYS:
                if arguments is not None:
                    self._break(member.key_start)
                    return
                arguments = member
        name = None
        if name_member is not None and name_member.value_start is not None:
            if text[name_member.value_start] != '"':
                self._break(name_member.value_start)
                return
            if name_member.value_end is not None:
                name = json.loads(text[name_member.value_start : name_member.value_end])
                if not name:
                    self._break(name_member.value_start)
                    return
        if arguments is not None and arguments.value_start is not None:
            if text[arguments.value_start] != "{":
                self._break(arguments.value_start)
                return
            self._arguments = arguments
        if scanner.end is not None:
            if name is None:
                self._break(scanner.end)
                return
            self.status = Status.DONE
            self.end = scanner.end
        if name is not None and (self._arguments is not None or self.status is Status.DONE):
            self.name = name

    def take_arguments(self, text: str) -> str:
        if self._arguments is None:
            if self.status is Status.DONE and not self._gave_default:
                self._gave_default = True
                return NO_ARGUMENTS
            return ""
        start = self._arguments.value_start if self._taken is None else self._taken
        assert start is not None
        # Until the arguments' value closes, everything read so far lies inside it.
        stop = len(text) if self._arguments.value_end is None else self._arguments.value_end
        self._taken = stop
        return text[start:stop]

    def _break(self, position: int) -> None:
        self.status = Status.BROKEN
        self.end = position
