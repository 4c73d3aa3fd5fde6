"""``GET /v1/server``: what the served engine was built with, for dashboards' header chips."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metrale_server.api.state import ServerState
from metrale_server.structured import GRAMMAR_BACKEND


async def server_info(request: Request, *, state: ServerState) -> Response:
    info = state.engine.info
    return JSONResponse(
        {
            "model": state.served_model_name,
            "task": state.task.name,
            "dtype": str(info.dtype).removeprefix("torch."),
            "quantization": info.quantization,
            "layer_steps": state.engine.layer_steps(),
            "kernels": info.kernels,
            "device": str(info.device),
            "num_kv_blocks": info.num_kv_blocks,
            "block_size": info.block_size,
            "max_batch_size": info.max_batch_size,
            "max_batch_tokens": info.max_batch_tokens,
            "max_seq_len": info.max_seq_len,
            "is_prefix_caching": info.is_prefix_caching,
            "started_at": state.started_at,
            "uptime_s": time.time() - state.started_at,
            "num_active_requests": state.num_active_requests,
            "structured_outputs": GRAMMAR_BACKEND,
            "tool_call_parser": state.tool_call_parser,
            "reasoning_parser": state.reasoning_parser,
        }
    )
