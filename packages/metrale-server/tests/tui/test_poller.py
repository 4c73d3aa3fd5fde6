"""The poller against servers that answer oddly or not at all (stdlib HTTP servers)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

from metrale_testing import serve_http_handler

from metrale_server.tui.poller import HttpPoller
from metrale_server.tui.snapshot import Status


@contextmanager
def serving(routes: Mapping[str, tuple[int, object]]) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server answering GET ``path`` with ``(status, JSON body)``, 404 otherwise;
    yields its URL and the Authorization headers it saw."""
    seen_auth: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen_auth.append(self.headers.get("Authorization", ""))
            status, body = routes.get(self.path, (404, {"error": {"message": "no route"}}))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serve_http_handler(Handler) as url:
        yield url, seen_auth


def test_nothing_listening_is_offline() -> None:
    with serving({}) as (url, _):
        pass  # the port is closed again
    snapshot = HttpPoller(url, timeout_s=1.0).poll()
    assert snapshot.status is Status.OFFLINE
    assert snapshot.error is not None
    assert snapshot.metrics is None


def test_loading_reads_only_health_and_version() -> None:
    routes = {
        "/health": (503, {"status": "loading", "model": "m"}),
        "/version": (200, {"version": "9.9"}),
    }
    with serving(routes) as (url, _):
        snapshot = HttpPoller(url).poll()
    assert snapshot.status is Status.LOADING
    assert snapshot.model == "m"
    assert snapshot.version == "9.9"
    assert snapshot.error is None
    assert snapshot.loading_progress is None


def test_loading_progress_comes_from_health() -> None:
    routes = {"/health": (503, {"status": "loading", "progress": {"done": 12, "total": 30}})}
    with serving(routes) as (url, _):
        assert HttpPoller(url).poll().loading_progress == (12, 30)
    malformed = {"/health": (503, {"status": "loading", "progress": {"done": "x", "total": 0}})}
    with serving(malformed) as (url, _):
        assert HttpPoller(url).poll().loading_progress is None


def test_a_server_without_the_dashboard_routes_shows_n_a() -> None:
    routes = {"/health": (200, {"status": "ready", "model": "m"}), "/metrics": (200, "")}
    with serving(routes) as (url, _):
        snapshot = HttpPoller(url).poll()
    assert snapshot.status is Status.SERVING
    assert snapshot.server is None
    assert snapshot.memory is None
    assert snapshot.recent_requests == ()


def test_faulted_and_draining_come_from_health() -> None:
    for body, status in (
        ({"status": "faulted", "reason": "x"}, Status.FAULTED),
        ({"status": "draining"}, Status.DRAINING),
    ):
        with serving({"/health": (503, body)}) as (url, _):
            assert HttpPoller(url).poll().status is status


def test_a_malformed_memory_document_is_an_error_not_data() -> None:
    routes = {
        "/health": (200, {"status": "ready"}),
        "/memory": (200, {"kv_blocks": "many"}),
    }
    with serving(routes) as (url, _):
        snapshot = HttpPoller(url).poll()
    assert snapshot.memory is None
    assert snapshot.error is not None
    assert "/memory" in snapshot.error


def test_the_api_key_is_sent_as_a_bearer_token() -> None:
    with serving({"/health": (200, {"status": "ready"})}) as (url, seen):
        HttpPoller(url, api_key="k1").poll()
    assert seen
    assert set(seen) == {"Bearer k1"}
