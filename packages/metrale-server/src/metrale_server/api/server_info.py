"""``GET /v1/server``: what the served engine was built with, for dashboards' header chips."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metrale_server.api.state import ServerState
from metrale_server.engine.layer_compiler import LayerCompiler
from metrale_server.structured import GRAMMAR_BACKEND


async def server_info(request: Request, *, state: ServerState) -> Response:
    engine = state.engine
    loaded = engine.loaded
    return JSONResponse(
        {
            "model": state.served_model_name,
            "task": state.task.name,
            "dtype": str(loaded.dtype).removeprefix("torch."),
            "quantization": str(loaded.quantization),
            "layer_steps": LayerCompiler.state(engine.core.compiler, loaded.model),
            "kernels": loaded.model.backend.describe(),
            "device": str(loaded.device),
            "num_kv_blocks": engine.num_kv_blocks,
            "block_size": engine.args.block_size,
            "max_batch_size": engine.args.max_batch_size,
            "max_batch_tokens": engine.args.max_batch_tokens,
            "max_seq_len": engine.max_seq_len,
            "is_prefix_caching": engine.core.prefix_caching,
            "started_at": state.started_at,
            "uptime_s": time.time() - state.started_at,
            "num_active_requests": state.num_active_requests,
            "structured_outputs": GRAMMAR_BACKEND,
            "tool_call_parser": state.tool_call_parser,
            "reasoning_parser": state.reasoning_parser,
        }
    )
