"""The dashboard inside ``met serve``: when to show it, and how it takes over the log.

While it runs, log records go to its log panel instead of stderr, and the loader's own
progress bar is switched off (two live displays would tear the screen); on ``close()`` the
stderr handler comes back and the last log lines are written to it.
"""

from __future__ import annotations

import logging
import os
import signal
import ssl
import sys
import threading
from collections.abc import Mapping
from typing import TextIO

from metrale_config import read_bool_lever
from metrale_server.tui.live_loop import Dashboard
from metrale_server.tui.log_buffer import LogBuffer
from metrale_server.tui.poller import HttpPoller

NUM_LINES_REPLAYED = 20
LOOPBACK = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}


def is_dashboard_wanted(
    *,
    no_tui: bool,
    environ: Mapping[str, str] | None = None,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> bool:
    """True unless ``--no-tui``, ``METRALE_NO_TUI`` is true, or stdin/stdout is not a
    terminal."""
    if no_tui or read_bool_lever("METRALE_NO_TUI", environ):
        return False
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    return _is_terminal(stdin) and _is_terminal(stdout)


def local_url(host: str, port: int, *, scheme: str = "http") -> str:
    """The URL this process reaches its own listener at (loopback for a wildcard bind)."""
    host = LOOPBACK.get(host, host)
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


class ServeDashboard:
    """A ``Dashboard`` on its own thread over the server in this process; ``q`` drains."""

    def __init__(self, url: str, *, api_key: str | None) -> None:
        self.log_buffer = LogBuffer()
        # Its own listener: over TLS, the certificate need not name the loopback address.
        tls_context = ssl._create_unverified_context() if url.startswith("https:") else None
        self.dashboard = Dashboard(
            HttpPoller(url, api_key=api_key, tls_context=tls_context),
            self.log_buffer,
            on_quit=_drain_this_process,
            is_local=True,
        )
        self._thread = threading.Thread(target=self._run, name="metrale-tui", daemon=True)
        self._saved_handlers: list[logging.Handler] = []

    def start(self) -> None:
        root = logging.getLogger()
        self._saved_handlers = list(root.handlers)
        self.log_buffer.setLevel(root.level)
        root.handlers[:] = [self.log_buffer]
        # The loader's rich bar would draw over the dashboard, which shows the load itself.
        os.environ["METRALE_NO_PROGRESS"] = "1"
        self._thread.start()

    def close(self) -> None:
        """Stop the dashboard, give the terminal back, and replay the last log lines."""
        self.dashboard.stop()
        self._thread.join(timeout=5.0)
        self._restore_log()
        for line in self.log_buffer.lines()[-NUM_LINES_REPLAYED:]:
            print(line, file=sys.stderr)

    def _run(self) -> None:
        try:
            self.dashboard.run()
        except Exception:
            self._restore_log()
            logging.getLogger("metrale.tui").exception("the dashboard stopped")

    def _restore_log(self) -> None:
        root = logging.getLogger()
        if self.log_buffer in root.handlers:
            root.handlers[:] = self._saved_handlers


def _drain_this_process() -> None:
    """``q`` does what Ctrl-C does: the server's SIGINT handler drains, then exits 0."""
    os.kill(os.getpid(), signal.SIGINT)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
