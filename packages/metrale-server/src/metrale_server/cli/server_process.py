"""``ServerProcess``: ``met serve`` as a child process on a local port (benchmarks, tests).

Only the standard library talks to the child (``urllib`` polls ``/health``), so callers bring
whichever HTTP client they measure with.
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
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

POLL_INTERVAL_S = 0.02


class ServerStartError(RuntimeError):
    """The child exited or never became ready; the message ends with its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (another process may still take it)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@attrs.define(eq=False)
class ServerProcess:
    """A running ``python -m metrale_server serve`` with its stderr in ``log_path``.

    ``health_statuses`` records every ``/health`` answer seen while waiting (``None`` for a
    refused connection), in order.
    """

    process: subprocess.Popen[bytes]
    host: str
    port: int
    log_path: Path
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
    ) -> ServerProcess:
        """Start the child; ``serve_args`` are ``met serve``'s (MODEL and flags, no address)."""
        port = free_port(host) if port is None else port
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix="metrale-serve-", suffix=".log")
            os.close(handle)
            log_path = Path(name)
        command = [sys.executable, "-m", "metrale_server", "serve", *serve_args]
        command += ["--host", host, "--port", str(port)]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=None if env is None else dict(env),
            )
        return cls(process=process, host=host, port=port, log_path=log_path)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

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
        """Poll ``/health`` until it answers 200; raise ``ServerStartError`` on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"the server exited with {self.process.returncode}:\n{self.log_text()}"
                )
            status = self.health()
            self.health_statuses.append(status)
            if status == 200:
                return
            time.sleep(POLL_INTERVAL_S)
        raise ServerStartError(f"not ready after {timeout_s:g} s:\n{self.log_text()}")

    def terminate(self) -> None:
        """Send SIGTERM: the server drains and exits."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        """The exit status; raises ``subprocess.TimeoutExpired`` if it is still running."""
        return self.process.wait(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``; returns the status
        (``None`` when it had to be killed)."""
        self.terminate()
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")
