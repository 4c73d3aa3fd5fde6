"""A cap on open connections: listening sockets that count what they accept.

Hypercorn has no connection limit, and every connection holds a file descriptor, buffers and a
task whether or not it sends anything. ``cap_connections`` wraps the server's listening sockets:
past ``limit`` open connections, a new one is answered ``503`` with ``Retry-After`` (plain
HTTP; a TLS one is closed) and closed at once, as uvicorn's ``--limit-concurrency`` does. A slot
is freed when its connection's socket is closed (asyncio closes it when the connection ends).
"""

from __future__ import annotations

import json
import resource
import socket

import attrs

# File descriptors kept for everything but client connections: the model's files, the native
# build, logs, the engine's pipes.
RESERVED_FDS = 128
# Connections beyond the requests a server holds: /health, /metrics and idle keep-alives.
SPARE_CONNECTIONS = 64
MAX_NOFILE = 65536
RETRY_AFTER_S = 1


@attrs.define
class ConnectionCount:
    """Open connections accepted through the capped sockets (all on the event loop's thread)."""

    limit: int
    open_files_limit: int
    num_open: int = 0
    num_refused: int = 0

    def try_open(self) -> bool:
        if self.num_open >= self.limit:
            self.num_refused += 1
            return False
        self.num_open += 1
        return True

    def close_one(self) -> None:
        self.num_open -= 1


class _CountedConnection(socket.socket):
    """An accepted connection that gives its slot back when it is closed, once."""

    count: ConnectionCount | None = None

    def close(self) -> None:
        count, self.count = self.count, None
        if count is not None:
            count.close_one()
        super().close()


class _CappedListener(socket.socket):
    """A listening socket whose ``accept`` (what asyncio's server calls) refuses connections
    past the count's limit and returns only those it keeps."""

    count: ConnectionCount
    is_tls: bool

    def accept(self) -> tuple[socket.socket, object]:
        while True:
            fd, address = self._accept()  # type: ignore[attr-defined]
            connection = _CountedConnection(self.family, self.type, self.proto, fileno=fd)
            if socket.getdefaulttimeout() is None and self.gettimeout():
                connection.setblocking(True)
            if self.count.try_open():
                connection.count = self.count
                return connection, address
            _refuse(connection, self.count.limit, is_tls=self.is_tls)
            # Then the next pending connection; BlockingIOError when there is none.


def refusal_response(limit: int) -> bytes:
    """The 503 a connection past the cap gets, in OpenAI's error shape."""
    body = json.dumps(
        {
            "error": {
                "message": f"the server has {limit} open connections, its limit "
                "(met serve --max-connections); retry later",
                "type": "server_error",
                "param": None,
                "code": "too_many_connections",
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        f"Retry-After: {RETRY_AFTER_S}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def _refuse(connection: socket.socket, limit: int, *, is_tls: bool) -> None:
    with connection:
        if is_tls:
            return  # no handshake here: plain bytes would only confuse the client
        try:
            connection.setblocking(False)
            # What the client sent already is read first: closing over unread bytes resets the
            # connection, and the client could lose the answer.
            connection.recv(65536)
        except OSError:
            pass
        try:
            connection.send(refusal_response(limit))
            connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def cap_connections(
    listeners: list[socket.socket], count: ConnectionCount, *, is_tls: bool
) -> list[socket.socket]:
    """The same listening sockets (the originals are detached), their connections counted in
    ``count`` and refused past its limit."""
    capped: list[socket.socket] = []
    for listener in listeners:
        wrapped = _CappedListener(
            listener.family, listener.type, listener.proto, fileno=listener.detach()
        )
        wrapped.count = count
        wrapped.is_tls = is_tls
        capped.append(wrapped)
    return capped


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (at most
    ``MAX_NOFILE``), as vLLM does; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = MAX_NOFILE if hard == resource.RLIM_INFINITY else min(hard, MAX_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return MAX_NOFILE if soft == resource.RLIM_INFINITY else soft


def default_max_connections(max_requests: int | None, open_files_limit: int) -> int:
    """Room for every request the server holds (running and queued) plus spare connections,
    within the file descriptors left after ``RESERVED_FDS``; with no request bound, all of
    those."""
    room = max(1, open_files_limit - RESERVED_FDS)
    if max_requests is None:
        return room
    return min(room, max_requests + SPARE_CONNECTIONS)
