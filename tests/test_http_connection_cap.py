"""``met serve --max-connections``: past the cap a new connection is answered 503 with
``Retry-After`` and closed, the connections already open keep being served, and a slot freed by
a closed connection is taken by the next one."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from metrale_testing import served

from metrale_bench.server_process import ServerProcess

MAX_CONNECTIONS = 3


@pytest.fixture(scope="module")
def capped_server(
    tiny_model_factory: Callable[[int], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    args = [
        str(tiny_model_factory(256)),
        "--served-model-name", "tiny-llama",
        "--device", "cpu",
        "--dtype", "float32",
        "--max-batch-size", "4",
        "--num-kv-blocks", "64",
        "--max-connections", str(MAX_CONNECTIONS),
        "--no-tui",
    ]  # fmt: skip
    with served(args, tmp_path_factory.mktemp("cap"), ready_timeout_s=120) as process:
        yield process


def get_health(connection: socket.socket) -> bytes:
    """``GET /health`` on an open connection, kept alive; the response's head and body."""
    connection.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    return read_response(connection)


def read_response(connection: socket.socket) -> bytes:
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = connection.recv(4096)
        if not chunk:
            return received
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += connection.recv(4096)
    return received


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def test_connections_past_the_cap_are_503_and_a_freed_slot_is_reused(
    capped_server: ServerProcess,
) -> None:
    assert f"{MAX_CONNECTIONS} open connections (503 past it" in capped_server.log_text()
    held = [connect(capped_server.port) for _ in range(MAX_CONNECTIONS)]
    try:
        for connection in held:
            assert get_health(connection).startswith(b"HTTP/1.1 200")
        with connect(capped_server.port) as extra:
            refused = get_health(extra)
            assert refused.startswith(b"HTTP/1.1 503"), refused
            assert b"retry-after: 1" in refused.lower()
            assert b'"code": "too_many_connections"' in refused
            assert b"--max-connections" in refused
            assert extra.recv(1) == b""  # and closed
        # The connections within the cap are still served, on the same sockets.
        assert all(get_health(c).startswith(b"HTTP/1.1 200") for c in held)
        held.pop().close()
        deadline = time.monotonic() + 5
        while True:
            with connect(capped_server.port) as again:
                if get_health(again).startswith(b"HTTP/1.1 200"):
                    break
            assert time.monotonic() < deadline, "the freed slot was never given back"
            time.sleep(0.05)
    finally:
        for connection in held:
            connection.close()
    # A client with a retrying pool sees the server whole again.
    assert httpx.get(f"{capped_server.base_url}/health", timeout=10).status_code == 200
