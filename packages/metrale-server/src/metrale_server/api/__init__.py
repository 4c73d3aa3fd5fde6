"""The OpenAI-compatible HTTP API (Starlette): ``create_app(ServerState(...))``.

The names below are imported on first use (PEP 562): a module that only needs a small piece of
the API (the dashboard reading ``recent_requests``) does not import the routes and torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metrale_server.api.app import create_app
    from metrale_server.api.errors import ApiError
    from metrale_server.api.metrics import ServerMetrics
    from metrale_server.api.state import DEFAULT_MAX_BODY_BYTES, ServerState

_HOMES = {
    "DEFAULT_MAX_BODY_BYTES": "metrale_server.api.state",
    "ApiError": "metrale_server.api.errors",
    "ServerMetrics": "metrale_server.api.metrics",
    "ServerState": "metrale_server.api.state",
    "create_app": "metrale_server.api.app",
}

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ApiError", "ServerMetrics", "ServerState", "create_app"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'metrale_server.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
