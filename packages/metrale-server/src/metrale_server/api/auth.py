"""API-key auth as a plain ASGI middleware: ``Authorization: Bearer <key>`` (OpenAI's clients)
or ``x-api-key: <key>`` (Anthropic's); health and the web UI's pages (no data in them) stay
open, and metrics and memory unless ``state.protect_observability``."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import Scope

from metrale_server.api.errors import ApiError, closing_if_body
from metrale_server.api.refusing_middleware import RefusingMiddleware
from metrale_server.api.state import ServerState
from metrale_server.webui import is_webui_path

HEALTH_PATHS = frozenset({"/health", "/health/live"})
OBSERVABILITY_PATHS = frozenset({"/metrics", "/memory"})


def is_open(path: str, state: ServerState) -> bool:
    """Whether ``path`` is served without a key."""
    return (
        path in HEALTH_PATHS
        or is_webui_path(path)
        or (path in OBSERVABILITY_PATHS and not state.protect_observability)
    )


def is_authorized(
    authorization: str | None, api_keys: tuple[str, ...], x_api_key: str | None = None
) -> bool:
    """``Authorization: Bearer K`` or ``x-api-key: K`` with K one of ``api_keys``; each key
    presented is compared with every key, each in constant time, so the time taken says
    nothing about which key came close."""
    scheme, _, token = (authorization or "").partition(" ")
    bearer = token.strip().encode() if scheme.lower() == "bearer" else b""
    presented = [key for key in (bearer, (x_api_key or "").strip().encode()) if key]
    matches = [hmac.compare_digest(p, key.encode()) for p in presented for key in api_keys]
    return any(matches)


class AuthMiddleware(RefusingMiddleware):
    """401 for a request without a valid key, when ``state.api_keys`` is not empty."""

    def refusal(self, scope: Scope, headers: Headers) -> ApiError | None:
        api_keys = self.state.api_keys
        if not api_keys or is_open(scope["path"], self.state):
            return None
        if is_authorized(headers.get("authorization"), api_keys, headers.get("x-api-key")):
            return None
        return ApiError(
            401,
            "a valid API key is required: send it as 'Authorization: Bearer <key>' or "
            "'x-api-key: <key>'",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer", **closing_if_body(headers)},
        )
