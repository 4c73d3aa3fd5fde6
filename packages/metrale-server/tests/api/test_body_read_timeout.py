"""A body that stops arriving gets a 408 and its connection closed, the server serving on; a
response may stream for longer than that timeout (Hypercorn's own read timeout, which ``met
serve`` once set, cut every connection whose client sent nothing for a minute, its streamed
generation included)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

from metrale_server import EngineArgs
from metrale_server.cli.serve_args import ServeArgs
from metrale_server.cli.serve_runtime import hypercorn_config

TIMEOUT_S = 0.5


def raw_exchange(base_url: str, request: bytes, *, wait_s: float) -> bytes:
    """Send ``request`` raw, then read until the server closes (at most ``wait_s``)."""
    parts = urlsplit(base_url)
    assert parts.hostname is not None
    assert parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=wait_s) as conn:
        conn.sendall(request)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    return received


def test_a_body_that_stops_arriving_is_408_and_the_server_serves_on(server: Any) -> None:
    body = json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 2}).encode()
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body[:10]
    )
    with server.overridden(body_read_timeout_s=TIMEOUT_S):
        start = time.monotonic()
        answer = raw_exchange(server.base_url, request, wait_s=10 * TIMEOUT_S + 5)
        waited = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert TIMEOUT_S <= waited < TIMEOUT_S + 5
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout"
    assert "no bytes for 0.5 s" in error["message"]
    response = server.client.post(
        "/v1/completions", json={"model": "tiny-llama", "prompt": "Hi", "max_tokens": 2}
    )
    assert response.status_code == 200, response.text


def test_a_stream_outlasts_the_body_timeout(server: Any) -> None:
    payload = {
        "model": "tiny-llama",
        "prompt": "Once upon a time",
        "max_tokens": 120,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with server.overridden(body_read_timeout_s=0.05):
        start = time.monotonic()
        with server.client.stream("POST", "/v1/completions", json=payload) as response:
            assert response.status_code == 200
            raw = b"".join(response.iter_bytes())
        elapsed = time.monotonic() - start
    assert elapsed > 0.05 * 4, "the stream must outlast the timeout to show anything"
    assert raw.endswith(b"data: [DONE]\n\n")
    frames = [f for f in raw.split(b"\n\n") if f.startswith(b"data: {")]
    assert sum(len(json.loads(f[6:])["choices"][0]["text"]) > 0 for f in frames) > 1


def test_met_serve_sets_no_connection_read_timeout() -> None:
    config = hypercorn_config(ServeArgs(engine_args=EngineArgs(), served_model_name="m"))
    assert config.read_timeout is None
