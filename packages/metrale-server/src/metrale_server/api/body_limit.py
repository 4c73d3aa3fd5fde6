"""Request body limits as a plain ASGI middleware: 413 without reading an oversized body, 408
for a body that stops arriving."""

from __future__ import annotations

import asyncio

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


def body_too_slow(timeout_s: float) -> ApiError:
    return ApiError(
        408,
        f"the request body stopped arriving: no bytes for {timeout_s:g} s",
        code="request_timeout",
        headers=dict(CLOSE_CONNECTION),
    )


class BodyLimitMiddleware:
    """Refuses bodies over ``state.max_body_bytes``, and bodies that stop arriving.

    A declared ``Content-Length`` over the limit is answered at once. Otherwise the body is
    counted as it streams in, and the read that crosses the limit raises the 413 ``ApiError``
    inside the route (the app's error handler renders it). Until the body is complete each read
    waits at most ``state.body_read_timeout_s`` (else a 408 the same way); after it, reads (the
    wait for a disconnect while a response streams) wait as long as the response runs.
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
        body_complete = False

        async def limited_receive() -> Message:
            nonlocal num_received, body_complete
            if body_complete:
                return await receive()
            timeout_s = self.state.body_read_timeout_s
            try:
                message = await asyncio.wait_for(receive(), timeout_s)
            except TimeoutError:
                raise body_too_slow(timeout_s) from None
            if message["type"] == "http.request":
                num_received += len(message.get("body", b""))
                if num_received > limit:
                    raise body_too_large(limit)
                body_complete = not message.get("more_body", False)
            return message

        await self.app(scope, limited_receive, send)
