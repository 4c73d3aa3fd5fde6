"""``mistral``: content, then calls after ``[TOOL_CALLS]``, in the tokenizer version's form:

- before v11 (Mistral-7B-Instruct-v0.3, Mixtral, Nemo): one JSON array of call objects,
  ``[TOOL_CALLS] [{"name": "f", "arguments": {...}, "id": "..."}, ...]``;
- v11 (Mistral-Small-3.2): ``[TOOL_CALLS]f[CALL_ID]abcDEF123[ARGS]{...}`` per call;
- v13 and later (Magistral, Ministral-3, Devstral-2, Mistral-Medium-3.5):
  ``[TOOL_CALLS]f[ARGS]{...}`` per call; ``f{...}`` without ``[ARGS]`` is read too.

The markers must be in the text (special tokens not skipped when detokenizing). Text after
the calls is content; a malformed call is content up to where that showed, and the search for
``[TOOL_CALLS]`` resumes there. The arguments stream as they are written.
"""

from __future__ import annotations

import re

from metrale_server.parsers.call_array import CallArrayReader
from metrale_server.parsers.json_scan import JsonScanner
from metrale_server.parsers.machine import Machine, MachineToolCallParser
from metrale_server.parsers.output import Output
from metrale_server.parsers.reading import Status, held_back, may_become, skip_whitespace

MARKER = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"

_NAME = re.compile(r"[\w.\-]+")
_CALL_ID_VALUE = re.compile(r"[A-Za-z0-9]*")


class NamedCallReader:
    """``name[CALL_ID]id[ARGS]{...}`` (the id part optional) at ``text[start]``; a
    ``CallReader``, ``DONE`` at the end of the arguments object."""

    def __init__(self, start: int) -> None:
        self.status = Status.PARTIAL
        self.end = start
        self.name: str | None = None
        self._start = start
        self._arguments: JsonScanner | None = None
        self._header_name = ""
        self._taken = 0

    def read(self, text: str, *, is_final: bool, out: Output) -> None:
        if self.status is not Status.PARTIAL:
            return
        if self._arguments is None:
            status, position, name = self._read_header(text, is_final=is_final)
            if status is not Status.DONE:
                self._settle(status, position, out)
                return
            self._arguments = JsonScanner(position)
            self._taken = position
            self._header_name = name
        arguments = self._arguments
        arguments.advance(text, is_final=is_final)
        if arguments.failed_at is not None:
            self._settle(Status.BROKEN, arguments.failed_at, out)
            return
        self.name = self._header_name
        out.follow(self, text)
        if arguments.end is not None:
            self._settle(Status.DONE, arguments.end, out)

    def take_arguments(self, text: str) -> str:
        assert self._arguments is not None
        stop = len(text) if self._arguments.end is None else self._arguments.end
        start, self._taken = self._taken, stop
        return text[start:stop]

    def _read_header(self, text: str, *, is_final: bool) -> tuple[Status, int, str]:
        """``DONE`` with the arguments' start (their ``{``) and the name, once both are
        read; else ``PARTIAL`` or ``BROKEN`` with where that showed."""
        match = _NAME.match(text, self._start)
        position = self._start if match is None else match.end()
        name = text[self._start : position]
        if position == len(text) and not is_final:
            return Status.PARTIAL, position, name
        if not name:
            return Status.BROKEN, position, name
        if text.startswith(CALL_ID, position):
            position = _CALL_ID_VALUE.match(text, position + len(CALL_ID)).end()  # type: ignore[union-attr]
            if not text.startswith(ARGS, position):
                waits = not is_final and may_become(text, position, ARGS)
                return (Status.PARTIAL if waits else Status.BROKEN), position, name
            position += len(ARGS)
        elif text.startswith(ARGS, position):
            position += len(ARGS)
        elif not is_final and (
            may_become(text, position, ARGS) or may_become(text, position, CALL_ID)
        ):
            return Status.PARTIAL, position, name
        position = skip_whitespace(text, position)
        if position == len(text) and not is_final:
            return Status.PARTIAL, position, name
        if position == len(text) or text[position] != "{":
            return Status.BROKEN, position, name
        return Status.DONE, position, name

    def _settle(self, status: Status, end: int, out: Output) -> None:
        if status is Status.PARTIAL:
            return
        if status is Status.DONE:
            out.close_call()
        else:
            out.drop_call()
        self.status = status
        self.end = end


class MistralMachine:
    def __init__(self) -> None:
        self._position = 0  # the first character not handed over yet
        self._segment_start = 0  # the marker of the calls being read
        self._calls: CallArrayReader | NamedCallReader | None = None

    def advance(self, text: str, *, is_final: bool, out: Output) -> None:
        while True:
            if self._calls is None:
                found = text.find(MARKER, self._position)
                if found < 0:
                    stop = (
                        len(text)
                        if is_final
                        else len(text) - held_back(text, self._position, MARKER)
                    )
                    out.content(text[self._position : stop])
                    self._position = stop
                    return
                out.content(text[self._position : found])
                self._segment_start = self._position = found
                start = skip_whitespace(text, found + len(MARKER))
                if start == len(text):
                    if not is_final:
                        return  # keeps the marker: found again next time
                    out.content(text[found:])
                    self._position = len(text)
                    return
                if text[start] == "[":
                    self._calls = CallArrayReader(start)
                else:
                    self._calls = NamedCallReader(start)
            calls = self._calls
            calls.read(text, is_final=is_final, out=out)
            if calls.status is Status.PARTIAL:
                return
            if calls.status is Status.BROKEN:
                content_from = self._segment_start
                if isinstance(calls, CallArrayReader) and calls.last_call_end is not None:
                    content_from = calls.last_call_end
                out.content(text[content_from : calls.end])
            self._position = calls.end
            self._calls = None


class MistralToolCallParser(MachineToolCallParser):
    def new_machine(self) -> Machine:
        return MistralMachine()
