"""``TaggedBlockMachine``: calls written as ``<tool_call>...</tool_call>`` blocks among text
(``hermes``, ``glm45``).

Text outside the blocks is content; a partial ``<tool_call>`` at the end of the text so far
is held back until the next delta decides it. Each block is read by the format's block
reader. A block that turns out malformed is content, verbatim, up to where that showed, and
the search for the next ``<tool_call>`` resumes there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from metrale_server.parsers.output import Output
from metrale_server.parsers.reading import Status, held_back, may_become, skip_whitespace

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


class BlockReader(Protocol):
    """Reads one block from just after its ``<tool_call>``: ``DONE`` with ``end`` after its
    ``</tool_call>`` (or at the end of a final text, when the block is complete but for that
    tag), having closed its call in the output; ``BROKEN`` with ``end`` where that showed,
    having dropped its call."""

    @property
    def status(self) -> Status: ...

    @property
    def end(self) -> int: ...

    def read(self, text: str, *, is_final: bool, out: Output) -> None: ...


class TaggedBlockMachine:
    def __init__(self, new_block: Callable[[int], BlockReader]) -> None:
        self._new_block = new_block
        self._position = 0  # the first character not handed over yet
        self._block: BlockReader | None = None
        self._block_start = 0

    def advance(self, text: str, *, is_final: bool, out: Output) -> None:
        while True:
            if self._block is None:
                found = text.find(OPEN, self._position)
                if found < 0:
                    stop = (
                        len(text) if is_final else len(text) - held_back(text, self._position, OPEN)
                    )
                    out.content(text[self._position : stop])
                    self._position = stop
                    return
                out.content(text[self._position : found])
                self._block_start = self._position = found
                self._block = self._new_block(found + len(OPEN))
            block = self._block
            block.read(text, is_final=is_final, out=out)
            if block.status is Status.PARTIAL:
                return
            if block.status is Status.BROKEN:
                out.content(text[self._block_start : block.end])
            self._position = block.end
            self._block = None


def close_tag_status(text: str, position: int, *, is_final: bool) -> tuple[Status, int]:
    """After a block's call: whitespace, then ``</tool_call>`` (or the end of a final text).
    The block's status and end."""
    position = skip_whitespace(text, position)
    if text.startswith(CLOSE, position):
        return Status.DONE, position + len(CLOSE)
    if position == len(text):
        return (Status.DONE if is_final else Status.PARTIAL), position
    if not is_final and may_become(text, position, CLOSE):
        return Status.PARTIAL, position
    return Status.BROKEN, position
