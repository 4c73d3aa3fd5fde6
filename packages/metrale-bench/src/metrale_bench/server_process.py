"""``ServerProcess``: ``met serve`` as a child process on a local port (benchmarks, tests).

The bench never imports the server: the child is ``python -m metrale_server serve`` run by
this interpreter, and only the standard library talks to it (``urllib`` polls ``/health``),
so callers bring whichever HTTP client they measure with. ``running_server`` is the context
manager a benchmark wants; tests that signal or time the child use the object directly.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs

POLL_INTERVAL_S = 0.02
STOP_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 4000


class ServerStartError(RuntimeError):
    """The child exited or never became ready; the message ends with its log's tail.
    ``returncode`` is the child's exit status (negative: the signal that ended it), ``None``
    when it was still running."""

    def __init__(self, message: str, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (another process may still take it)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def serve_command(serve_args: Sequence[str], *, host: str, port: int) -> list[str]:
    """``met serve ARGS --host HOST --port PORT`` run by this interpreter."""
    command = [sys.executable, "-m", "metrale_server", "serve", *serve_args]
    return [*command, "--host", host, "--port", str(port)]


@attrs.define(eq=False)
class ServerProcess:
    """A running ``python -m metrale_server serve`` with its output in ``log_path``.

    ``health_statuses`` records every ``/health`` answer seen while waiting (``None`` for a
    refused connection), in order; ``ready_s`` is the time from start to the first 200.
    """

    process: subprocess.Popen[bytes]
    host: str
    port: int
    log_path: Path
    command: tuple[str, ...] = ()
    started_at: float = attrs.field(factory=time.monotonic)
    ready_s: float | None = None
    health_statuses: list[int | None] = attrs.field(factory=list)

    @classmethod
    def start(
        cls,
        serve_args: Sequence[str],
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        terminal_fd: int | None = None,
    ) -> ServerProcess:
        """Start the child; ``serve_args`` are ``met serve``'s (MODEL and flags, no address).

        Its stdout and stderr go to ``log_path`` (a new temporary file by default). With
        ``terminal_fd`` (a pseudo-terminal's end) its stdin and stdout are that terminal, in a
        session of its own, and only stderr goes to the log. ``env`` replaces the environment.
        """
        port = free_port(host) if port is None else port
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix="metrale-serve-", suffix=".log")
            os.close(handle)
            log_path = Path(name)
        command = serve_command(serve_args, host=host, port=port)
        started_at = time.monotonic()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL if terminal_fd is None else terminal_fd,
                stdout=log if terminal_fd is None else terminal_fd,
                stderr=subprocess.STDOUT if terminal_fd is None else log,
                env=None if env is None else dict(env),
                start_new_session=terminal_fd is not None,
            )
        return cls(
            process=process,
            host=host,
            port=port,
            log_path=log_path,
            command=tuple(command),
            started_at=started_at,
        )

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def health(self) -> int | None:
        """The status ``/health`` answers, or ``None`` when nothing accepts the connection."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Poll ``/health`` until it answers 200; raise :class:`ServerStartError` when the
        child exits or ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"the server exited with {self.process.returncode}:\n{self.log_tail()}",
                    self.process.returncode,
                )
            status = self.health()
            self.health_statuses.append(status)
            if status == 200:
                self.ready_s = time.monotonic() - self.started_at
                return
            time.sleep(POLL_INTERVAL_S)
        raise ServerStartError(f"not ready after {timeout_s:g} s:\n{self.log_tail()}")

    def is_running(self) -> bool:
        return self.process.poll() is None

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` if the child still runs."""
        if self.is_running():
            self.process.send_signal(signum)

    def terminate(self) -> None:
        """Send SIGTERM: the server drains and exits."""
        self.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        """The exit status; raises ``subprocess.TimeoutExpired`` if it is still running."""
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL, then reap, if the child still runs."""
        if self.is_running():
            self.process.kill()
        self.process.wait()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``; returns the status
        (``None`` when it had to be killed)."""
        self.terminate()
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_tail(self, num_chars: int = LOG_TAIL_CHARS) -> str:
        return self.log_text()[-num_chars:]


@contextmanager
def running_server(
    serve_args: Sequence[str],
    *,
    ready_timeout_s: float = 600.0,
    stop_timeout_s: float = STOP_TIMEOUT_S,
    host: str = "127.0.0.1",
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
) -> Iterator[ServerProcess]:
    """Start the server, yield it once ``/health`` is 200, then :meth:`ServerProcess.stop` it.
    Raises :class:`ServerStartError` when it exits or times out first."""
    server = ServerProcess.start(serve_args, host=host, env=env, log_path=log_path)
    try:
        server.wait_ready(ready_timeout_s)
        yield server
    finally:
        server.stop(stop_timeout_s)
