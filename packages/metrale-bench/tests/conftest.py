"""A second, independent OpenAI-compatible server: a small Starlette app streaming fake tokens.

It shows the harness is not tied to metrale. It answers ``/v1/models``, ``/version``,
``/health``, ``/memory``, ``/tokenize`` and both streaming endpoints. Its tokenizer makes
``FAKE_TOKENS_PER_WORD`` tokens of a word (one of a token id); every output token is one SSE
chunk ``"tok "`` sent ``TOKEN_DELAY_S`` apart. The model name picks a misbehaviour:
``broken`` answers 500, ``no-usage`` omits usage, ``no-finish`` never gives a finish reason,
``silent`` streams no text, ``no-tokenize`` gets a 404 from ``/tokenize``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from metrale_testing import serve_app_in_thread, stay_eager
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

stay_eager()

FAKE_MODEL = "fake-model"
TOKEN_DELAY_S = 0.002
FIRST_TOKEN_DELAY_S = 0.01
FAKE_TOKENS_PER_WORD = 2
MIB = 1 << 20
FAKE_MEMORY = {
    "kv_blocks": 64,
    "kv_block_bytes": 2 * MIB,
    "max_batch_size": 8,
    "budget_bytes": 512 * MIB,
    "ledger_live_bytes": 300 * MIB,
    "mem_available_at_start_bytes": 10_000 * MIB,
    "mem_available_now_bytes": 9_400 * MIB,
    "rss_anon_bytes": 650 * MIB,
    "device": "cpu",
    "total_bytes": 16_000 * MIB,
    "gpu_memory_utilization": 0.9,
    "block_size": 16,
    "max_seq_len": 2048,
    "kv_bytes_per_token": 128 * 1024,
    "plan_by_owner": {"weights": 200 * MIB, "kv": 128 * MIB},
    "ledger_by_owner": {"weights": 172 * MIB, "kv": 128 * MIB},
}


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


def _count(text: str) -> int:
    return FAKE_TOKENS_PER_WORD * len(text.split())


def _prompt_tokens(body: dict[str, Any]) -> int:
    if "messages" in body:
        return sum(_count(str(m.get("content", ""))) for m in body["messages"]) + 3
    prompt = body.get("prompt", "")
    return len(prompt) if isinstance(prompt, list) else _count(str(prompt))


async def _events(body: dict[str, Any], is_chat: bool) -> AsyncIterator[str]:
    model = body.get("model")
    num_tokens = int(body.get("max_tokens", 16))
    await asyncio.sleep(FIRST_TOKEN_DELAY_S)
    for index in range(num_tokens):
        is_last = index == num_tokens - 1
        finish = "length" if is_last and model != "no-finish" else None
        text = "" if model == "silent" else "tok "
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if is_chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        yield _sse({"id": "x", "model": model, "choices": [choice], "usage": None})
        if not is_last:
            await asyncio.sleep(TOKEN_DELAY_S)
    if model != "no-usage":
        prompt_tokens = _prompt_tokens(body)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": num_tokens,
            "total_tokens": prompt_tokens + num_tokens,
        }
        yield _sse({"id": "x", "model": model, "choices": [], "usage": usage})
    yield "data: [DONE]\n\n"


async def _generate(request: Request, is_chat: bool) -> Response:
    body = await request.json()
    if body.get("model") == "broken":
        return JSONResponse({"error": {"message": "broken on purpose"}}, status_code=500)
    return StreamingResponse(_events(body, is_chat), media_type="text/event-stream")


async def completions(request: Request) -> Response:
    return await _generate(request, is_chat=False)


async def chat(request: Request) -> Response:
    return await _generate(request, is_chat=True)


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": FAKE_MODEL, "object": "model"}]})


async def version(request: Request) -> Response:
    return JSONResponse({"version": "fake-0.0.1"})


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def memory(request: Request) -> Response:
    return JSONResponse(FAKE_MEMORY)


async def tokenize(request: Request) -> Response:
    body = await request.json()
    if body.get("model") == "no-tokenize":
        return JSONResponse({"error": {"message": "not here"}}, status_code=404)
    return JSONResponse({"count": _count(str(body.get("prompt", "")))})


def fake_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models),
            Route("/version", version),
            Route("/health", health),
            Route("/memory", memory),
            Route("/tokenize", tokenize, methods=["POST"]),
        ]
    )


@pytest.fixture(scope="session")
def fake_delays_s() -> tuple[float, float]:
    """The fake server's delay before the first token and between tokens."""
    return FIRST_TOKEN_DELAY_S, TOKEN_DELAY_S


@pytest.fixture(scope="session")
def fake_server_url() -> Iterator[str]:
    """The base URL of the fake server, served by Hypercorn on a thread for the session."""
    with serve_app_in_thread(fake_app(), error_log=False) as base_url:
        yield base_url
