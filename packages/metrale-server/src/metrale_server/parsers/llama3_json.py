"""``llama3_json``: Llama 3.1/3.2 answer with the call itself, a JSON object
``{"name": "f", "parameters": {...}}`` (``"arguments"`` is read too), optionally after
``<|python_tag|>``, several calls joined by ``;`` (``; `` as Meta's template asks).

The output is calls only when it starts (after whitespace) with the tag or ``{`` and the
object is a well-formed call; from the first text that is not a call on (a non-call object,
anything after the calls but another ``; {``), the rest of the output is content. The
arguments stream as they are written.
"""

from __future__ import annotations

import enum

from metrale_server.parsers.call_object import CallObjectReader
from metrale_server.parsers.machine import Machine, MachineToolCallParser
from metrale_server.parsers.output import Output
from metrale_server.parsers.reading import Status, may_become, skip_whitespace

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = ";"


class _Mode(enum.Enum):
    START = enum.auto()
    CALLS = enum.auto()
    CONTENT = enum.auto()  # the rest is content


class Llama3JsonMachine:
    def __init__(self) -> None:
        self._mode = _Mode.START
        self._position = 0  # the first character not handed over yet
        self._call: CallObjectReader | None = None

    def advance(self, text: str, *, is_final: bool, out: Output) -> None:
        if self._mode is _Mode.START:
            self._start(text, is_final=is_final, out=out)
        if self._mode is _Mode.CALLS:
            self._read_calls(text, is_final=is_final, out=out)
        if self._mode is _Mode.CONTENT:
            out.content(text[self._position :])
            self._position = len(text)

    def _start(self, text: str, *, is_final: bool, out: Output) -> None:
        start = skip_whitespace(text, self._position)
        out.content(text[self._position : start])
        self._position = start
        first = start
        if text.startswith(PYTHON_TAG, start):
            first = skip_whitespace(text, start + len(PYTHON_TAG))
        elif not is_final and may_become(text, start, PYTHON_TAG):
            return
        if first == len(text) and not is_final:
            return
        if first < len(text) and text[first] == "{":
            self._mode = _Mode.CALLS
            self._call = CallObjectReader(first)
        else:
            self._mode = _Mode.CONTENT

    def _read_calls(self, text: str, *, is_final: bool, out: Output) -> None:
        """``self._position`` stays where the text not yet known to be calls begins: the
        output's start (after whitespace), then the end of the last call."""
        while True:
            call = self._call
            if call is not None:
                call.read(text, is_final=is_final)
                if call.status is Status.BROKEN:
                    out.drop_call()
                    self._mode = _Mode.CONTENT
                    return
                out.follow(call, text)
                if call.status is Status.PARTIAL:
                    return
                out.close_call()
                self._position = call.end
                self._call = None
            position = skip_whitespace(text, self._position)
            if text.startswith(SEPARATOR, position):
                position = skip_whitespace(text, position + len(SEPARATOR))
                if position < len(text) and text[position] == "{":
                    self._call = CallObjectReader(position)
                    continue
            if position == len(text) and not is_final:
                return
            self._mode = _Mode.CONTENT
            return


class Llama3JsonToolCallParser(MachineToolCallParser):
    def new_machine(self) -> Machine:
        return Llama3JsonMachine()
