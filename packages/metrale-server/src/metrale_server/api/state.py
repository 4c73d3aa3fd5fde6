"""``ServerState``: what the HTTP app serves and the flags the server process flips."""

from __future__ import annotations

import time
from collections.abc import Iterable

import attrs

from metrale_server.api.logprobs import TokenTexts
from metrale_server.api.metrics import ServerMetrics
from metrale_server.api.prepare import RequestPreparer
from metrale_server.api.responses_store import ResponseStore
from metrale_server.engine.client import EngineClient
from metrale_server.image_limits import ImageLimits
from metrale_server.pooling.model_task import ModelTask

DEFAULT_MAX_BODY_BYTES = 8 * 2**20
DEFAULT_BODY_READ_TIMEOUT_S = 60.0


def _keys(keys: Iterable[str]) -> tuple[str, ...]:
    return tuple(keys)


def _timeout_s(value: float | None) -> float | None:
    """``None`` or 0 disables the request timeout."""
    if value is None or value == 0:
        return None
    if value < 0:
        raise ValueError(f"request_timeout_s must be >= 0, got {value}")
    return float(value)


@attrs.define(eq=False, kw_only=True)
class ServerState:
    """One served model and the settings every request reads.

    Fields are read per request, so changing ``api_keys``, ``request_timeout_s`` or
    ``max_body_bytes`` takes effect at once. ``is_ready`` turns ``/health`` to 200;
    ``is_draining`` (set on shutdown) answers new generation requests with 503 while the ones
    in flight (``num_active_requests``) finish. ``tool_call_parser`` and ``reasoning_parser``
    name the parsers chat outputs go through (``--tool-call-parser``, ``--reasoning-parser``).

    The guards (:mod:`metrale_server.api.request_guard`): ``allowed_hosts`` the ``Host`` names
    served (``None``: any); ``allowed_origins`` the web origins CORS lets read responses (read
    when the app is made); ``protect_observability`` puts ``/metrics`` and ``/memory`` behind
    the API key; ``max_queued_requests`` bounds the requests waiting for the running batch
    (``None``: unbounded), past which a generation request gets a 429.

    ``body_read_timeout_s``: the longest wait for the next bytes of a request's body; a client
    that stops sending mid-body (a slow upload holding its buffer) gets a 408 and its connection
    closed. A response may take as long as it takes.

    ``task``: what the model serves (the engine's, ``--task``); a route of another task
    answers 400 (:mod:`metrale_server.api.task_check`).
    """

    engine: EngineClient
    served_model_name: str
    api_keys: tuple[str, ...] = attrs.field(default=(), converter=_keys)
    request_timeout_s: float | None = attrs.field(default=None, converter=_timeout_s)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_read_timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    allowed_hosts: frozenset[str] | None = None
    allowed_origins: tuple[str, ...] = ()
    protect_observability: bool = False
    max_queued_requests: int | None = None
    image_limits: ImageLimits = attrs.field(factory=ImageLimits)
    metrics: ServerMetrics = attrs.field(
        default=attrs.Factory(
            lambda self: ServerMetrics(self.engine, self.served_model_name), takes_self=True
        )
    )
    token_texts: TokenTexts = attrs.field(
        default=attrs.Factory(lambda self: TokenTexts(self.engine.tokenizer), takes_self=True),
        repr=False,
    )
    task: ModelTask = attrs.field(
        default=attrs.Factory(lambda self: self.engine.info.task, takes_self=True)
    )
    preparer: RequestPreparer = attrs.field(factory=RequestPreparer, repr=False)
    # The Responses API's stored responses (host heap, outside the memory plan).
    response_store: ResponseStore = attrs.field(factory=ResponseStore, repr=False)
    started_at: float = attrs.field(factory=time.time)
    is_ready: bool = False
    is_draining: bool = False
    num_active_requests: int = 0
