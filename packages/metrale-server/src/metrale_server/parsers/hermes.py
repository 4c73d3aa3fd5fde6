"""``hermes``: Qwen2.5/Qwen3 and Hermes models write each call as a JSON object in a block,
``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``, after any content.

Whitespace around the object is free; a final block missing only its ``</tool_call>`` (the
output stopped there) is still a call. The arguments stream as they are written.
"""

from __future__ import annotations

from metrale_server.parsers.call_object import CallObjectReader
from metrale_server.parsers.machine import Machine, MachineToolCallParser
from metrale_server.parsers.output import Output
from metrale_server.parsers.reading import Status, skip_whitespace
from metrale_server.parsers.tagged_blocks import TaggedBlockMachine, close_tag_status


class HermesBlock:
    """A ``BlockReader``: whitespace, a call object, whitespace, ``</tool_call>``."""

    def __init__(self, start: int) -> None:
        self.status = Status.PARTIAL
        self.end = start
        self._call: CallObjectReader | None = None

    def read(self, text: str, *, is_final: bool, out: Output) -> None:
        if self.status is not Status.PARTIAL:
            return
        if self._call is None:
            position = skip_whitespace(text, self.end)
            if position == len(text):
                if is_final:
                    self._settle(Status.BROKEN, position, out)
                return
            if text[position] != "{":
                self._settle(Status.BROKEN, position, out)
                return
            self._call = CallObjectReader(position)
        call = self._call
        call.read(text, is_final=is_final)
        status, end = call.status, call.end
        if status is Status.DONE:
            status, end = close_tag_status(text, call.end, is_final=is_final)
        if status is Status.BROKEN:
            self._settle(status, end, out)
            return
        out.follow(call, text)
        if status is Status.DONE:
            self._settle(status, end, out)

    def _settle(self, status: Status, end: int, out: Output) -> None:
        if status is Status.DONE:
            out.close_call()
        else:
            out.drop_call()
        self.status = status
        self.end = end


class HermesToolCallParser(MachineToolCallParser):
    def new_machine(self) -> Machine:
        return TaggedBlockMachine(HermesBlock)
