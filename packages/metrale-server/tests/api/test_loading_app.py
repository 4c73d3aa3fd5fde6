"""``LoadingApp`` before the API takes over: /health says loading, with the loader's count."""

from __future__ import annotations

import asyncio

import httpx
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from metrale_server.api.loading_app import LOADING_CODE, LoadingApp


def get(app: LoadingApp, path: str) -> httpx.Response:
    async def request() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get(path)

    return asyncio.run(request())


def test_health_reports_loading_then_the_tensors_loaded() -> None:
    app = LoadingApp("m")
    first = get(app, "/health")
    assert first.status_code == 503
    assert first.json() == {"status": "loading", "model": "m"}
    app.set_progress(7, 272)
    assert get(app, "/health").json()["progress"] == {"done": 7, "total": 272}
    assert get(app, "/health/live").status_code == 200
    other = get(app, "/v1/models")
    assert other.status_code == 503
    assert other.json()["error"]["code"] == LOADING_CODE


def test_the_api_takes_over_every_path() -> None:
    async def api(scope: Scope, receive: Receive, send: Send) -> None:
        await JSONResponse({"path": scope["path"]})(scope, receive, send)

    app = LoadingApp("m")
    app.set_progress(272, 272)
    app.serve(api)
    assert get(app, "/health").json() == {"path": "/health"}
