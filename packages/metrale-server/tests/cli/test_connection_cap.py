"""The connection cap's arithmetic and its refusal, without a server (the served cap is tested
end to end in ``tests/test_http_connection_cap.py``)."""

from __future__ import annotations

import json
import socket

from metrale_server.cli.connection_cap import (
    RESERVED_FDS,
    SPARE_CONNECTIONS,
    ConnectionCount,
    cap_connections,
    default_max_connections,
    refusal_response,
)


def test_the_default_holds_every_request_plus_spares_within_the_open_files() -> None:
    assert default_max_connections(1280, 65536) == 1280 + SPARE_CONNECTIONS
    assert default_max_connections(1280, 1024) == 1024 - RESERVED_FDS
    assert default_max_connections(None, 4096) == 4096 - RESERVED_FDS
    assert default_max_connections(None, 10) == 1


def test_the_refusal_is_a_whole_503_in_openais_error_shape() -> None:
    head, _, body = refusal_response(7).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 503 Service Unavailable"
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert headers["Retry-After"] == "1"
    assert headers["Connection"] == "close"
    assert int(headers["Content-Length"]) == len(body)
    error = json.loads(body)["error"]
    assert error["code"] == "too_many_connections"
    assert "7 open connections" in error["message"]


def test_a_capped_listener_counts_and_refuses_then_frees_on_close() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    count = ConnectionCount(limit=1, open_files_limit=1024)
    [capped] = cap_connections([listener], count, is_tls=False)
    capped.settimeout(5)
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
    try:
        kept, _ = capped.accept()
        assert count.num_open == 1
        capped.setblocking(False)
        try:
            capped.accept()  # refuses the second client, then finds no other
            raise AssertionError("a connection past the cap was accepted")
        except BlockingIOError:
            pass
        assert count.num_refused == 1
        assert clients[1].recv(4096).startswith(b"HTTP/1.1 503")
        kept.close()
        kept.close()  # a slot is freed once
        assert count.num_open == 0
    finally:
        for client in clients:
            client.close()
        capped.close()
