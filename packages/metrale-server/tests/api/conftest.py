"""A real server for the API tests: Hypercorn on a free 127.0.0.1 port, in a background thread,
serving the tiny random Llama through an ``AsyncEngine``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from metrale_testing import serve_app_in_thread
from starlette.applications import Starlette

from metrale_server import AsyncEngine, Engine, EngineArgs, build_engine
from metrale_server.api import ServerState, create_app
from metrale_server.cli.serve_runtime import freeze_heap

MODEL_NAME = "tiny-llama"


@attrs.define
class RunningServer:
    """The server under test, with the objects behind it and a client to talk to it."""

    base_url: str
    state: ServerState
    app: Starlette
    engine: Engine
    client: httpx.Client

    @contextmanager
    def overridden(self, **fields: Any) -> Iterator[None]:
        """Set ``ServerState`` fields for the duration of the block."""
        saved = {name: getattr(self.state, name) for name in fields}
        for name, value in fields.items():
            setattr(self.state, name, value)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(self.state, name, value)

    def metric(self, name: str, labels: str = "") -> float:
        """One sample's value from ``/metrics`` (0 if absent); ``labels`` is a substring the
        sample's label set must contain."""
        text = self.client.get("/metrics").text
        for line in text.splitlines():
            if line.startswith(name) and (line[len(name)] in " {") and labels in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    @staticmethod
    def parse_sse(raw: bytes) -> list[Any]:
        return parse_sse(raw)

    def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Until the engine holds no request and every KV block is free again."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (
                self.metric("metrale_num_requests_running") == 0
                and self.metric("metrale_num_requests_waiting") == 0
                and self.engine.block_manager.num_free_blocks == self.engine.num_kv_blocks
                and self.state.num_active_requests == 0
            ):
                return
            time.sleep(0.02)
        raise AssertionError("the server did not become idle")


def greedy_chat(
    server: RunningServer, messages: list[dict[str, Any]], /, **fields: Any
) -> dict[str, Any]:
    """The 200 body of a greedy chat completion of ``messages`` in 10 tokens (``fields`` may
    replace either): the twin another API surface's answer is compared with."""
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 10, "temperature": 0}
    response = server.client.post("/v1/chat/completions", json={**body, **fields})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def parse_sse(raw: bytes) -> list[Any]:
    """The events of an SSE body, checking the framing exactly: ``data: {json}\\n\\n`` frames,
    then ``data: [DONE]\\n\\n`` last. Returns the decoded JSON payloads."""
    assert raw.endswith(b"data: [DONE]\n\n"), raw[-200:]
    frames = raw.split(b"\n\n")
    assert frames[-1] == b""
    assert frames[-2] == b"data: [DONE]"
    payloads = []
    for frame in frames[:-2]:
        assert frame.startswith(b"data: "), frame
        assert b"\n" not in frame
        payloads.append(json.loads(frame[len(b"data: ") :].decode("utf-8")))
    return payloads


@contextmanager
def running_server(
    engine: Engine, model_name: str = MODEL_NAME, **state_fields: Any
) -> Iterator[RunningServer]:
    """``engine`` served over HTTP until the block exits; ``state_fields`` set ``ServerState``
    fields read when the app is made (``allowed_origins``)."""
    async_engine = AsyncEngine(engine)
    state = ServerState(
        engine=async_engine,
        served_model_name=model_name,
        api_keys=(),
        request_timeout_s=None,
        max_body_bytes=1 << 20,
        **state_fields,
    )
    state.is_ready = True
    freeze_heap()  # as met serve does once the model is loaded
    app = create_app(state)
    try:
        with (
            serve_app_in_thread(app, ready_path="/health/live") as base_url,
            httpx.Client(base_url=base_url, timeout=60) as client,
        ):
            yield RunningServer(
                base_url=base_url, state=state, app=app, engine=engine, client=client
            )
    finally:
        async_engine.shutdown()


@pytest.fixture(scope="session")
def serve_engine() -> Callable[..., AbstractContextManager[RunningServer]]:
    """``with serve_engine(engine, name) as server:`` for tests that need their own model."""
    return running_server


@pytest.fixture(scope="session")
def server(tiny_model_dir: Path) -> Iterator[RunningServer]:
    engine = build_engine(EngineArgs(model=str(tiny_model_dir), dtype="float32", max_batch_size=32))
    with running_server(engine) as running:
        yield running
