"""What a web page must not be able to do to a server on this machine, as a plain ASGI middleware.

- A page on another site can send a "simple" cross-origin POST (``text/plain``, a form) with
  no preflight: every POST body must be declared ``application/json``, which a browser only
  sends cross-origin after a CORS preflight the server does not grant (415 otherwise).
- DNS rebinding points a name the attacker controls at 127.0.0.1, making the page same-origin
  with the server: the ``Host`` header then carries the attacker's name, so only the names in
  ``state.allowed_hosts`` are served (400 otherwise).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import Scope

from metrale_server.api.errors import ApiError, closing_if_body, has_body
from metrale_server.api.refusing_middleware import RefusingMiddleware

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
JSON_MEDIA_TYPE = "application/json"


def default_allowed_hosts(bind_host: str) -> frozenset[str] | None:
    """The ``Host`` names served by default: this machine's names when bound to a loopback
    address (a page can reach it only through the browser), any when bound elsewhere (the names
    a network reaches it by are unknown here; ``--allowed-hosts`` lists them)."""
    host = bind_host.strip("[]").lower()
    if host in LOOPBACK_HOSTS or host.startswith("127."):
        return LOOPBACK_HOSTS | {host}
    return None


def host_name(host_header: str) -> str:
    """``example.com:8888`` -> ``example.com``, ``[::1]:8888`` -> ``::1``, lower-cased."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


def is_json(content_type: str | None) -> bool:
    media_type = (content_type or "").partition(";")[0].strip().lower()
    return media_type == JSON_MEDIA_TYPE or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


class RequestGuardMiddleware(RefusingMiddleware):
    """400 for a ``Host`` outside ``state.allowed_hosts``; 415 for a POST whose body is not
    declared JSON. Neither reads the body."""

    def refusal(self, scope: Scope, headers: Headers) -> ApiError | None:
        allowed = self.state.allowed_hosts
        host = headers.get("host")
        if allowed is not None and host is not None and host_name(host) not in allowed:
            return ApiError(
                400,
                f"the Host {host!r} is not served here (met serve --allowed-hosts lists the "
                "names this server answers to)",
                code="invalid_host",
                headers=closing_if_body(headers),
            )
        if (
            scope["method"] == "POST"
            and has_body(headers)
            and not is_json(headers.get("content-type"))
        ):
            return ApiError(
                415,
                f"a request body must be sent as {JSON_MEDIA_TYPE}, got "
                f"{headers.get('content-type') or 'no Content-Type'}",
                code="unsupported_media_type",
                headers=closing_if_body(headers),
            )
        return None
