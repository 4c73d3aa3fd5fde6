"""``POST /v1/score`` (vLLM's) and ``POST /v1/rerank`` (Jina's and Cohere's shape): a yes/no
reranker's relevance score for each (query, document) pair."""

from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metrale_server.api.fields import parse_json_object
from metrale_server.api.pooling import pooled_vectors, pooling_usage
from metrale_server.api.score_protocol import parse_rerank_request, parse_score_request
from metrale_server.api.state import ServerState


async def create_score(request: Request, *, state: ServerState) -> Response:
    raw = await request.body()
    parsed = await state.preparer.run(
        lambda: parse_score_request(
            parse_json_object(raw), state.engine, state.served_model_name, state.task
        )
    )
    response_id = f"score-{uuid.uuid4().hex}"
    vectors = await pooled_vectors(state, request, response_id, parsed.prompts)
    return JSONResponse(
        {
            "id": response_id,
            "object": "list",
            "created": int(time.time()),
            "model": state.served_model_name,
            "data": [
                {"index": index, "object": "score", "score": vector[0]}
                for index, vector in enumerate(vectors)
            ],
            "usage": pooling_usage(parsed.prompts),
        }
    )


async def create_rerank(request: Request, *, state: ServerState) -> Response:
    raw = await request.body()
    parsed = await state.preparer.run(
        lambda: parse_rerank_request(
            parse_json_object(raw), state.engine, state.served_model_name, state.task
        )
    )
    response_id = f"rerank-{uuid.uuid4().hex}"
    vectors = await pooled_vectors(state, request, response_id, parsed.prompts)
    ranked = sorted(range(len(vectors)), key=lambda index: -vectors[index][0])
    results = []
    for index in ranked[: parsed.top_n]:
        result: dict[str, Any] = {"index": index, "relevance_score": vectors[index][0]}
        if parsed.return_documents:
            result["document"] = {"text": parsed.documents[index]}
        results.append(result)
    return JSONResponse(
        {
            "id": response_id,
            "model": state.served_model_name,
            "usage": {"total_tokens": pooling_usage(parsed.prompts)["total_tokens"]},
            "results": results,
        }
    )
