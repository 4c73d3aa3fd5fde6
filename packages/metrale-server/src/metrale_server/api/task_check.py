"""The check every task-specific route makes first: the server's task must be the route's,
else a 400 naming the flag that would serve it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from metrale_server.api.errors import ApiError, closing_if_body
from metrale_server.api.state import ServerState
from metrale_server.pooling.model_task import TaskName

Endpoint = Callable[[Request], Awaitable[Response]]


def require_task(state: ServerState, task: TaskName, request: Request) -> None:
    served = state.task.name
    if served == task:
        return
    raise ApiError(
        400,
        f"this model serves task {served!r}; start the server with --task {task} for "
        f"{request.url.path}",
        code="unsupported_task",
        # Sent before the body is read: the connection cannot carry another request.
        headers=closing_if_body(request.headers),
    )


def for_task(task: TaskName, state: ServerState, endpoint: Endpoint) -> Endpoint:
    """``endpoint``, answered only when the server's task is ``task``."""

    async def checked(request: Request) -> Response:
        require_task(state, task, request)
        return await endpoint(request)

    return checked
