"""The shape of a middleware that refuses some requests from their headers alone: it answers
the refusal without reading the body, or passes the request on."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from metrale_server.api.errors import ApiError
from metrale_server.api.state import ServerState


class RefusingMiddleware:
    """Subclasses say, in :meth:`refusal`, which HTTP requests they refuse and how."""

    def __init__(self, app: ASGIApp, *, state: ServerState) -> None:
        self.app = app
        self.state = state

    def refusal(self, scope: Scope, headers: Headers) -> ApiError | None:
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self.refusal(scope, Headers(scope=scope))
            if error is not None:
                await error.to_response(scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)
