"""``create_app``: the Starlette application for one ``ServerState``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from metrale_server.api import anthropic_messages, misc_routes, responses_route
from metrale_server.api.auth import AuthMiddleware
from metrale_server.api.body_limit import BodyLimitMiddleware
from metrale_server.api.chat import create_chat_completion
from metrale_server.api.completions import create_completion
from metrale_server.api.embeddings import create_embedding
from metrale_server.api.errors import (
    ApiError,
    InternalErrorMiddleware,
    api_error_handler,
    http_exception_handler,
)
from metrale_server.api.memory_route import get_memory
from metrale_server.api.recent_requests import list_recent_requests
from metrale_server.api.request_guard import RequestGuardMiddleware
from metrale_server.api.score import create_rerank, create_score
from metrale_server.api.server_info import server_info
from metrale_server.api.state import ServerState
from metrale_server.api.task_check import for_task
from metrale_server.pooling.model_task import TaskName
from metrale_server.webui import webui_routes

ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE"]
# vLLM serves the rerank route at each of these paths.
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")

Endpoint = Callable[[Request], Awaitable[Response]]


def create_app(state: ServerState, *, webui: bool = True) -> Starlette:
    """The OpenAI-compatible API (``/v1/responses`` included) and Anthropic's Messages API
    (``/v1/messages``) over ``state``; routes, middleware and error shapes. The generation
    routes answer for a ``generate`` task only, ``/v1/embeddings`` for ``embed``, and
    ``/v1/score`` and the rerank routes for ``score``. ``webui``: the chat page at ``/`` and the
    dashboard at ``/dashboard`` (:mod:`metrale_server.webui`; off with ``--no-webui``).

    Middleware, outermost first: CORS for ``state.allowed_origins`` (none by default: a page
    on another origin cannot read a response), internal errors become 500s, the Host and
    content-type guard, auth, then the body limit.
    """

    def bound(endpoint: Callable[..., Awaitable[Response]]) -> Endpoint:
        return partial(endpoint, state=state)

    def task_route(
        path: str, task: TaskName, endpoint: Callable[..., Awaitable[Response]]
    ) -> Route:
        """A POST route answered only when the server's ``--task`` is ``task``."""
        return Route(path, for_task(task, state, bound(endpoint)), methods=["POST"])

    routes = [
        task_route("/v1/completions", "generate", create_completion),
        task_route("/v1/chat/completions", "generate", create_chat_completion),
        task_route("/v1/messages", "generate", anthropic_messages.create_message),
        Route(
            "/v1/messages/count_tokens",
            bound(anthropic_messages.count_tokens),
            methods=["POST"],
        ),
        task_route("/v1/responses", "generate", responses_route.create_response),
        task_route("/v1/embeddings", "embed", create_embedding),
        task_route("/v1/score", "score", create_score),
        *(task_route(path, "score", create_rerank) for path in RERANK_PATHS),
        Route(
            "/v1/responses/{response_id}",
            bound(responses_route.get_response),
            methods=["GET"],
        ),
        Route(
            "/v1/responses/{response_id}",
            bound(responses_route.delete_response),
            methods=["DELETE"],
        ),
        Route("/v1/models", bound(misc_routes.list_models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", bound(misc_routes.get_model), methods=["GET"]),
        Route("/health", bound(misc_routes.health), methods=["GET"]),
        Route("/health/live", misc_routes.health_live, methods=["GET"]),
        Route("/metrics", bound(misc_routes.metrics), methods=["GET"]),
        Route("/memory", bound(get_memory), methods=["GET"]),
        Route("/version", misc_routes.server_version, methods=["GET"]),
        Route("/tokenize", bound(misc_routes.tokenize), methods=["POST"]),
        Route("/v1/server", bound(server_info), methods=["GET"]),
        Route(
            "/v1/requests/recent",
            partial(list_recent_requests, recent=state.metrics.recent_requests),
            methods=["GET"],
        ),
        Route("/detokenize", bound(misc_routes.detokenize), methods=["POST"]),
    ]
    for prefix in misc_routes.NOT_IMPLEMENTED_PREFIXES:
        for path in (f"/v1/{prefix}", f"/v1/{prefix}/{{rest:path}}"):
            routes.append(Route(path, misc_routes.not_implemented, methods=ANY_METHOD))
    if webui:
        routes.extend(webui_routes())
    return Starlette(
        routes=routes,
        middleware=[
            *cors_middleware(state.allowed_origins),
            Middleware(InternalErrorMiddleware),
            Middleware(RequestGuardMiddleware, state=state),
            Middleware(AuthMiddleware, state=state),
            Middleware(BodyLimitMiddleware, state=state),
        ],
        exception_handlers={
            ApiError: api_error_handler,
            HTTPException: http_exception_handler,
        },
    )


def cors_middleware(allowed_origins: tuple[str, ...]) -> list[Middleware]:
    """CORS for these origins (``*``: any), with the headers an API client sends; none when
    empty, so a browser lets no other origin read a response or send a JSON POST."""
    if not allowed_origins:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=list(allowed_origins),
            allow_methods=["GET", "POST"],
            # x-api-key and anthropic-version: what Anthropic's clients send.
            allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"],
            max_age=600,
        )
    ]
