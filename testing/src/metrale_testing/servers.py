"""Servers for the tests: ``met serve`` as a child process, and an ASGI app under Hypercorn on
a thread; both on a free 127.0.0.1 port."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metrale_bench.server_process import ServerProcess

HOST = "127.0.0.1"


@contextmanager
def serve_http_handler(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """The standard library's threading HTTP server, answering with ``handler`` on a free
    127.0.0.1 port until the block exits (then the port is closed again); yields the base
    URL."""
    httpd = ThreadingHTTPServer((HOST, 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, name="test-http", daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    from metrale_bench.server_process import free_port as bench_free_port

    return bench_free_port(HOST)


@contextmanager
def served(
    serve_args: Sequence[str],
    log_dir: Path,
    *,
    ready_timeout_s: float = 180,
    stop_timeout_s: float = 30,
    **start: Any,
) -> Iterator[ServerProcess]:
    """``met serve SERVE_ARGS`` as a child process (its log ``log_dir/server.log``), ready (its
    ``/health`` 200) for the block; then stopped, and it must exit 0. ``start`` goes to
    ``ServerProcess.start`` (``env``, ``port``)."""
    from metrale_bench.server_process import ServerProcess

    process = ServerProcess.start(serve_args, log_path=log_dir / "server.log", **start)
    try:
        process.wait_ready(timeout_s=ready_timeout_s)
        yield process
    finally:
        exit_code = process.stop(timeout_s=stop_timeout_s)
    assert exit_code == 0, process.log_text()


def _wait_until_up(base_url: str, port: int, ready_path: str | None, deadline: float) -> None:
    import socket

    while True:
        try:
            if ready_path is None:
                with socket.create_connection((HOST, port), timeout=1):
                    return
            else:
                with urllib.request.urlopen(f"{base_url}{ready_path}", timeout=1) as response:
                    if response.status == 200:
                        return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the test server at {base_url} did not come up")
        time.sleep(0.02)


@contextmanager
def serve_app_in_thread(
    app: Any,
    *,
    ready_path: str | None = None,
    graceful_timeout_s: float = 2.0,
    error_log: bool = True,
    start_timeout_s: float = 30,
) -> Iterator[str]:
    """Serve the ASGI ``app`` with Hypercorn on a background thread until the block exits;
    yields the base URL once a connection is accepted (with ``ready_path``, once a GET of it
    answers 200)."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    port = free_port()
    config = Config()
    config.bind = [f"{HOST}:{port}"]
    config.accesslog = None
    if not error_log:
        config.errorlog = None
    config.graceful_timeout = graceful_timeout_s
    started = threading.Event()
    control: dict[str, Any] = {}

    def run() -> None:
        async def main() -> None:
            stop = asyncio.Event()
            control["loop"], control["stop"] = asyncio.get_running_loop(), stop
            started.set()
            await serve(app, config, shutdown_trigger=stop.wait)

        asyncio.run(main())

    thread = threading.Thread(target=run, name="test-hypercorn", daemon=True)
    thread.start()
    assert started.wait(start_timeout_s), "the test server's thread did not start"
    base_url = f"http://{HOST}:{port}"
    try:
        _wait_until_up(base_url, port, ready_path, time.monotonic() + start_timeout_s)
        yield base_url
    finally:
        control["loop"].call_soon_threadsafe(control["stop"].set)
        thread.join(30)
