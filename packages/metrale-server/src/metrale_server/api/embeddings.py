"""``POST /v1/embeddings``: OpenAI's embeddings, one engine request per input."""

from __future__ import annotations

import base64
import struct
import uuid
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metrale_server.api.embeddings_protocol import EncodingFormat, parse_embedding_request
from metrale_server.api.fields import parse_json_object
from metrale_server.api.pooling import pooled_vectors, pooling_usage
from metrale_server.api.state import ServerState


async def create_embedding(request: Request, *, state: ServerState) -> Response:
    raw = await request.body()
    parsed = await state.preparer.run(
        lambda: parse_embedding_request(
            parse_json_object(raw), state.engine, state.served_model_name, state.task
        )
    )
    vectors = await pooled_vectors(state, request, f"embd-{uuid.uuid4().hex}", parsed.prompts)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "object": "embedding",
                    "index": index,
                    "embedding": encode_vector(vector, parsed.encoding_format),
                }
                for index, vector in enumerate(vectors)
            ],
            "model": state.served_model_name,
            "usage": pooling_usage(parsed.prompts),
        }
    )


def encode_vector(vector: Sequence[float], encoding_format: EncodingFormat) -> Any:
    """The vector as a JSON array, or base64 of its little-endian float32 bytes."""
    if encoding_format == "float":
        return list(vector)
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
