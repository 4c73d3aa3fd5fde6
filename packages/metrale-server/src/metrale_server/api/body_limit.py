"""Request body size limit as a plain ASGI middleware: 413 without reading an oversized body."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from metrale_server.api.errors import CLOSE_CONNECTION, ApiError
from metrale_server.api.state import ServerState


def body_too_large(max_body_bytes: int) -> ApiError:
    # The rest of the body stays unread, so the connection cannot carry another request.
    return ApiError(
        413,
        f"the request body exceeds the limit of {max_body_bytes} bytes",
        code="request_too_large",
        headers=dict(CLOSE_CONNECTION),
    )


class BodyLimitMiddleware:
    """Refuses bodies over ``state.max_body_bytes``.

    A declared ``Content-Length`` over the limit is answered at once. Otherwise the body is
    counted as it streams in, and the read that crosses the limit raises the 413 ``ApiError``
    inside the route (the app's error handler renders it).
    """

    def __init__(self, app: ASGIApp, *, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.state.max_body_bytes
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await body_too_large(limit).to_response(scope["path"])(scope, receive, send)
            return
        num_received = 0

        async def limited_receive() -> Message:
            nonlocal num_received
            message = await receive()
            if message["type"] == "http.request":
                num_received += len(message.get("body", b""))
                if num_received > limit:
                    raise body_too_large(limit)
            return message

        await self.app(scope, limited_receive, send)
