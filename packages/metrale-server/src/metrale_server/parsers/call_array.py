"""``CallArrayReader``: a JSON array of call objects, ``[{"name": ..., "arguments": ...}, ...]``,
read as it grows (Mistral's ``[TOOL_CALLS]`` payload before v11, the output the ``required``
tool choice's grammar forces)."""

from __future__ import annotations

from metrale_server.parsers.call_object import CallObjectReader
from metrale_server.parsers.output import Output
from metrale_server.parsers.reading import Status, skip_whitespace


class CallArrayReader:
    """Reads the array at ``text[start]`` (``[``), sending each call to the output as it is
    read and closing it as soon as its object is complete and well-formed.

    ``DONE`` at the closing bracket of one or more calls (``[]`` is not a list of calls, and
    comes back as content). ``BROKEN`` where the array stops being one; the calls
    before stay closed, and ``last_call_end`` (``None`` before the first) tells where the
    text that is not theirs begins.
    """

    def __init__(self, start: int) -> None:
        self.status = Status.PARTIAL
        self.end = start
        self.last_call_end: int | None = None
        self._position = start + 1
        self._element: CallObjectReader | None = None
        self._needs_comma = False  # after a call: "," or "]"

    def read(self, text: str, *, is_final: bool, out: Output) -> None:
        while self.status is Status.PARTIAL:
            element = self._element
            if element is not None:
                element.read(text, is_final=is_final)
                if element.status is Status.BROKEN:
                    out.drop_call()
                    self._settle(Status.BROKEN, element.end)
                    return
                out.follow(element, text)
                if element.status is Status.PARTIAL:
                    return
                out.close_call()
                self.last_call_end = self._position = element.end
                self._element = None
                self._needs_comma = True
            position = skip_whitespace(text, self._position)
            if position == len(text):
                if is_final:
                    self._settle(Status.BROKEN, position)
                return
            char = text[position]
            if char == "]" and self._needs_comma:
                self._settle(Status.DONE, position + 1)
            elif char == "," and self._needs_comma:
                self._position = position + 1
                self._needs_comma = False
            elif char == "{" and not self._needs_comma:
                self._element = CallObjectReader(position)
            else:
                self._settle(Status.BROKEN, position)

    def _settle(self, status: Status, end: int) -> None:
        self.status = status
        self.end = end
