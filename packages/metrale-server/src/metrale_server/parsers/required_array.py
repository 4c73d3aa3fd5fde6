"""``openai_required``: the output ``tool_choice: "required"`` forces through its grammar, a
JSON array of ``{"name": "f", "parameters": {...}}`` calls (``"arguments"`` is read too).

An output that is not such an array (cut short by ``max_tokens``) is content from where it
stops being one: all of it when no call was complete, else the text after the last call.
"""

from __future__ import annotations

from metrale_server.parsers.call_array import CallArrayReader
from metrale_server.parsers.machine import Machine, MachineToolCallParser
from metrale_server.parsers.output import Output
from metrale_server.parsers.reading import Status, skip_whitespace


class RequiredArrayMachine:
    def __init__(self) -> None:
        self._position = 0  # the first character not handed over yet
        self._array: CallArrayReader | None = None
        self._is_content = False  # the rest is content

    def advance(self, text: str, *, is_final: bool, out: Output) -> None:
        if self._array is None and not self._is_content:
            start = skip_whitespace(text, self._position)
            out.content(text[self._position : start])
            self._position = start
            if start == len(text) and not is_final:
                return
            if start < len(text) and text[start] == "[":
                self._array = CallArrayReader(start)
            else:
                self._is_content = True
        array = self._array
        if array is not None and not self._is_content:
            array.read(text, is_final=is_final, out=out)
            if array.status is Status.PARTIAL:
                return
            self._is_content = True
            if array.status is Status.DONE:
                self._position = array.end
            elif array.last_call_end is not None:
                self._position = array.last_call_end
        out.content(text[self._position :])
        self._position = len(text)


class RequiredArrayParser(MachineToolCallParser):
    def new_machine(self) -> Machine:
        return RequiredArrayMachine()
