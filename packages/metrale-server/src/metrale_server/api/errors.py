"""Errors: the exception routes raise, and the handlers that render it, in OpenAI's shape, or
in Anthropic's on the Messages API paths (``/v1/messages``...)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

# For a response sent before the request body was read: the client must not reuse the
# connection, whose unread body the server discards by closing it.
CLOSE_CONNECTION = {"Connection": "close"}


def has_body(headers: Headers) -> bool:
    """Whether the request declares a body (which an early response leaves unread)."""
    return headers.get("content-length", "0") != "0" or "transfer-encoding" in headers


def closing_if_body(headers: Headers) -> dict[str, str]:
    return dict(CLOSE_CONNECTION) if has_body(headers) else {}


_TYPE_BY_STATUS = {501: "not_implemented_error", 503: "service_unavailable_error"}
ANTHROPIC_PATH = "/v1/messages"
_ANTHROPIC_TYPE_BY_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    """Whether ``path`` belongs to Anthropic's Messages API, whose errors take its shape."""
    return path == ANTHROPIC_PATH or path.startswith(f"{ANTHROPIC_PATH}/")


def anthropic_error_type(status: int) -> str:
    """Anthropic's ``error.type`` for an HTTP status: ``invalid_request_error`` for any other
    4xx, ``api_error`` for any other 5xx."""
    default = "invalid_request_error" if status < 500 else "api_error"
    return _ANTHROPIC_TYPE_BY_STATUS.get(status, default)


def error_type_for(status: int) -> str:
    """OpenAI's ``error.type`` for an HTTP status: ``invalid_request_error`` for every 4xx."""
    return _TYPE_BY_STATUS.get(status, "invalid_request_error" if status < 500 else "server_error")


class ApiError(Exception):
    """A request the API refuses or could not serve: an HTTP status and OpenAI's error fields.

    ``param`` names the request field at fault (``"max_tokens"``, ``"messages[0].role"``) or
    is ``None`` when no single field is.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or error_type_for(status)
        self.headers = headers

    def to_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_anthropic_body(self) -> dict[str, Any]:
        """Anthropic's shape; the message names the field at fault, as ``param`` does."""
        return {
            "type": "error",
            "error": {"type": anthropic_error_type(self.status), "message": self.message},
        }

    def to_response(self, path: str = "") -> JSONResponse:
        """The response for a request to ``path``: Anthropic's shape on its paths."""
        body = self.to_anthropic_body() if is_anthropic_path(path) else self.to_body()
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def bad_request(message: str, *, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def internal_error(
    what: str, *, headers: Mapping[str, str] | None = None, log_traceback: bool = True
) -> ApiError:
    """A 500 whose body names a fresh error id and nothing of the failure; the log line, with
    the traceback of the exception being handled, carries the same id and says ``what``."""
    error_id = f"err-{secrets.token_hex(8)}"
    log = logger.exception if log_traceback else logger.error
    log("%s (error id %s)", what, error_id)
    return ApiError(
        500,
        f"internal server error (error id {error_id}: the server log has the details)",
        code="internal_error",
        headers={**(headers or {}), "X-Error-Id": error_id},
    )


async def api_error_handler(request: Request, error: Exception) -> Response:
    assert isinstance(error, ApiError)
    return error.to_response(request.url.path)


async def http_exception_handler(request: Request, error: Exception) -> Response:
    """Starlette's own 404 / 405 (and any other ``HTTPException``) as an ``ApiError``."""
    assert isinstance(error, HTTPException)
    if error.status_code == 404:
        message = f"no route for {request.method} {request.url.path}"
    elif error.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = error.detail or HTTPStatus(error.status_code).phrase
    headers = {**(error.headers or {}), **closing_if_body(request.headers)}
    return ApiError(error.status_code, message, headers=headers).to_response(request.url.path)


class InternalErrorMiddleware:
    """An exception escaping a route becomes a 500 (``ApiError``'s shape); the server goes on.

    Once a response has started nothing can be sent in its place, so the exception is
    re-raised for the server to close the connection.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        is_started = False

        async def tracking_send(message: Message) -> None:
            nonlocal is_started
            is_started = is_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            return  # the client left while sending its body: nobody to answer
        except Exception as error:
            if is_started:
                raise
            del error  # internal_error logs it, traceback and all
            response = internal_error(
                f"internal error serving {scope['method']} {scope['path']}",
                headers=closing_if_body(Headers(scope=scope)),
            )
            await response.to_response(scope["path"])(scope, receive, send)
