"""What the readers of a growing output report, and small text helpers they share.

A reader follows one piece of an output (a call, a block, an array of calls) as its text grows.
After each ``read`` it has a ``status``: ``PARTIAL`` while more text may still change what it
is, ``DONE`` once it is a well-formed call (or run of calls) ending at ``end``, ``BROKEN`` once
it cannot be one, ``end`` then being where that showed. ``DONE`` and ``BROKEN`` are final.
Readers read all the text they are given before reporting, so a reading never depends on how
the text was split into deltas, only on the text and on whether it is final.
"""

from __future__ import annotations

import enum
import re
from typing import Protocol

_WHITESPACE = re.compile(r"[ \t\r\n]*")


class Status(enum.Enum):
    PARTIAL = enum.auto()
    DONE = enum.auto()
    BROKEN = enum.auto()


class CallReader(Protocol):
    """One call as read so far.

    ``name`` is set (and then never changes) once the call may be announced: its name is
    complete and its arguments have begun, or the call is ``DONE``. ``take_arguments(text)``
    returns the argument text read since the last take (all of it by ``DONE``); it is only
    called once ``name`` is set.
    """

    @property
    def status(self) -> Status: ...

    @property
    def end(self) -> int: ...

    @property
    def name(self) -> str | None: ...

    def take_arguments(self, text: str) -> str: ...


def skip_whitespace(text: str, position: int) -> int:
    """The first position at or after ``position`` that is not JSON whitespace."""
    return _WHITESPACE.match(text, position).end()  # type: ignore[union-attr]


def held_back(text: str, start: int, marker: str) -> int:
    """How many characters at the end of ``text[start:]`` could be the start of ``marker``."""
    for length in range(min(len(marker) - 1, len(text) - start), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


def may_become(text: str, position: int, marker: str) -> bool:
    """Whether ``text[position:]``, which ends the text so far, could still grow into
    ``marker`` (it is a proper prefix of it)."""
    tail = text[position:]
    return len(tail) < len(marker) and marker.startswith(tail)
