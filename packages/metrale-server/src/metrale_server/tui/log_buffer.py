"""``LogBuffer``: a logging handler that keeps the last lines for the dashboard's log panel."""

from __future__ import annotations

import logging
from collections import deque

DEFAULT_NUM_LINES = 500
TUI_LOG_FORMAT = "%(asctime)s %(levelname)-7s %(message)s"
TUI_DATE_FORMAT = "%H:%M:%S"


class LogBuffer(logging.Handler):
    """Keeps the last ``num_lines`` formatted records; ``lines()`` is safe from any thread."""

    def __init__(self, num_lines: int = DEFAULT_NUM_LINES) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(TUI_LOG_FORMAT, TUI_DATE_FORMAT))
        self._lines: deque[str] = deque(maxlen=num_lines)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        # A record of several lines (a traceback) keeps each as its own line.
        self._lines.extend(text.splitlines() or [""])

    def lines(self) -> tuple[str, ...]:
        with self.lock or _NO_LOCK:
            return tuple(self._lines)


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()
