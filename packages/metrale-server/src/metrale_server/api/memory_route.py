"""``GET /memory``: the plan, the allocation ledger and host readings (``MemoryReport``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metrale_server.api.state import ServerState


async def get_memory(request: Request, *, state: ServerState) -> Response:
    # The /proc reads are a few microseconds; no need to leave the event loop.
    return JSONResponse(state.engine.memory_document())
