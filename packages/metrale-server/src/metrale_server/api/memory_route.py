"""``GET /memory``: the plan, the allocation ledger and host readings (``MemoryReport``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metrale_server.api.state import ServerState
from metrale_server.memory.report import memory_report


async def get_memory(request: Request, *, state: ServerState) -> Response:
    # The /proc reads are a few microseconds; no need to leave the event loop.
    engine = state.engine
    document = memory_report(engine.plan, engine.ledger, engine.loaded.device).to_json()
    if engine.core.rank_memory:
        # Every rank's plan and ledger as each stood once loaded (nothing is allocated later).
        document["ranks"] = [rank.to_json() for rank in engine.core.rank_memory]
    return JSONResponse(document)
