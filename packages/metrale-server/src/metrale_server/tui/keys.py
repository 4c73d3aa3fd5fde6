"""Keys from the terminal, one at a time, without waiting for Enter.

``KeyReader`` puts a terminal stdin in cbreak mode (Ctrl-C still sends SIGINT) for the life
of its ``with`` block; on anything but a terminal it reads nothing, so the dashboard still
runs (e.g. under a test that only watches it).
"""

from __future__ import annotations

import enum
import os
import select
import sys
import termios
import time
import tty
from types import TracebackType
from typing import Any, TextIO


class Action(enum.Enum):
    QUIT = "quit"
    NEXT_PAGE = "next_page"
    TOGGLE_HELP = "toggle_help"
    CLOSE_HELP = "close_help"


KEY_ACTIONS = {
    "q": Action.QUIT,
    "Q": Action.QUIT,
    "\t": Action.NEXT_PAGE,
    "?": Action.TOGGLE_HELP,
    "h": Action.TOGGLE_HELP,
    "\x1b": Action.CLOSE_HELP,
}


def actions_for(keys: str) -> list[Action]:
    """The actions the typed characters ask for, in order; other keys are ignored."""
    return [KEY_ACTIONS[key] for key in keys if key in KEY_ACTIONS]


class KeyReader:
    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = sys.stdin if stream is None else stream
        self._fd: int | None = None
        self._saved: list[Any] | None = None

    def __enter__(self) -> KeyReader:
        try:
            fd = self._stream.fileno()
        except (AttributeError, OSError, ValueError):
            return self
        if os.isatty(fd):
            self._fd = fd
            self._saved = termios.tcgetattr(fd)
            tty.setcbreak(fd)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._fd is not None and self._saved is not None:
            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
        self._fd = None

    def read(self, timeout_s: float) -> str:
        """What was typed within ``timeout_s`` (empty if nothing; without a terminal it just
        waits ``timeout_s``)."""
        if self._fd is None:
            time.sleep(max(0.0, timeout_s))
            return ""
        readable, _, _ = select.select([self._fd], [], [], max(0.0, timeout_s))
        if not readable:
            return ""
        data = os.read(self._fd, 64)
        return data.decode("utf-8", errors="replace")
