"""``boot_server``: run ``met serve`` as a child process for the length of a benchmark.

The bench never imports the server: it runs ``python -m metrale_server serve`` with this
interpreter and waits for ``GET /health`` to answer 200.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs
import httpx

POLL_INTERVAL_S = 0.1
STOP_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 4000


class ServerBootError(RuntimeError):
    """The server exited or never became ready; the message ends with its log's tail."""


@attrs.frozen(kw_only=True)
class BootedServer:
    base_url: str
    command: tuple[str, ...]
    log_path: Path
    boot_s: float


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def serve_command(
    model: str | None, serve_args: Sequence[str], *, host: str, port: int
) -> list[str]:
    """``met serve [MODEL] ARGS --host HOST --port PORT`` run by this interpreter."""
    command = [sys.executable, "-m", "metrale_server", "serve"]
    if model is not None:
        command.append(model)
    return [*command, *serve_args, "--host", host, "--port", str(port)]


@contextmanager
def boot_server(
    model: str | None = None,
    serve_args: Sequence[str] = (),
    *,
    ready_timeout_s: float = 600.0,
    log_path: Path | None = None,
) -> Iterator[BootedServer]:
    """Start the server, yield once ``/health`` is 200, then SIGTERM it (SIGKILL after
    ``STOP_TIMEOUT_S``). Raises :class:`ServerBootError` when it exits or times out first."""
    host = "127.0.0.1"
    port = free_port(host)
    if log_path is None:
        handle, name = tempfile.mkstemp(prefix="metrale-bench-serve-", suffix=".log")
        os.close(handle)
        log_path = Path(name)
    command = serve_command(model, serve_args, host=host, port=port)
    started = time.perf_counter()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        base_url = f"http://{host}:{port}"
        _wait_ready(process, base_url, log_path, ready_timeout_s)
        yield BootedServer(
            base_url=base_url,
            command=tuple(command),
            log_path=log_path,
            boot_s=time.perf_counter() - started,
        )
    finally:
        _stop(process)


def _wait_ready(
    process: subprocess.Popen[bytes], base_url: str, log_path: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=base_url, timeout=5.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ServerBootError(
                    f"the server exited with {process.returncode}:\n{_log_tail(log_path)}"
                )
            try:
                if client.get("/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(POLL_INTERVAL_S)
    raise ServerBootError(f"not ready after {timeout_s:g} s:\n{_log_tail(log_path)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _log_tail(log_path: Path) -> str:
    return log_path.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL_CHARS:]
