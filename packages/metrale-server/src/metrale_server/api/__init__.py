"""The OpenAI-compatible HTTP API (Starlette): ``create_app(ServerState(...))``."""

from metrale_server.api.app import create_app
from metrale_server.api.errors import ApiError
from metrale_server.api.metrics import ServerMetrics
from metrale_server.api.state import DEFAULT_MAX_BODY_BYTES, ServerState

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ApiError", "ServerMetrics", "ServerState", "create_app"]
