"""Clients that go away abort their requests: the engine ends up idle with every KV block free."""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

NUM_STREAMS = 20
MAX_TOKENS = 480


def long_request(index: int) -> tuple[str, dict[str, Any]]:
    common = {"max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True, "seed": index}
    if index % 2:
        return "/v1/completions", {"prompt": [100 + index, 200, 300], **common}
    messages = [{"role": "user", "content": f"Tell me a long story number {index}."}]
    return "/v1/chat/completions", {"messages": messages, **common}


def test_dropped_streams_free_their_kv_blocks(server: Any) -> None:
    server.wait_idle()
    generated_before = server.metric("metrale_generation_tokens_total")
    aborted_before = server.metric("metrale_request_success_total", 'finished_reason="abort"')
    with ExitStack() as stack:
        responses = []
        for index in range(NUM_STREAMS):
            path, body = long_request(index)
            response = stack.enter_context(server.client.stream("POST", path, json=body))
            assert response.status_code == 200
            responses.append(response)
        # The stats snapshot is published after each engine step: the first (the prompts'
        # prefill) may still be running when the last stream opens.
        deadline = time.monotonic() + 10
        while server.metric("metrale_num_requests_running") == 0:
            assert time.monotonic() < deadline, "no request ever ran"
            time.sleep(0.01)
        for response in responses:
            received = b""
            for piece in response.iter_bytes():
                received += piece
                if received.count(b"\n\n") >= 3:
                    break
            assert received.startswith(b"data: {")
            assert b"[DONE]" not in received
    server.wait_idle()
    assert server.metric("metrale_num_requests_running") == 0
    assert server.metric("metrale_num_requests_waiting") == 0
    assert server.metric("metrale_kv_cache_usage_perc") == 0.0
    assert server.engine.block_manager.num_free_blocks == server.engine.num_kv_blocks
    generated = server.metric("metrale_generation_tokens_total") - generated_before
    assert generated < NUM_STREAMS * MAX_TOKENS / 2
    # Each left request is counted and listed (ids and counts) as aborted, with the tokens it
    # made before its client left.
    aborted = server.metric("metrale_request_success_total", 'finished_reason="abort"')
    assert aborted - aborted_before == NUM_STREAMS
    recent = server.client.get("/v1/requests/recent").json()["data"][:NUM_STREAMS]
    assert [entry["finish_reason"] for entry in recent] == ["abort"] * NUM_STREAMS
    assert all(0 < entry["num_completion_tokens"] < MAX_TOKENS for entry in recent)
    assert all(entry["num_prompt_tokens"] > 0 for entry in recent)
    ok = server.client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3})
    assert ok.status_code == 200


def test_a_non_streamed_request_whose_client_left_is_aborted(server: Any) -> None:
    server.wait_idle()
    aborted_before = server.metric("metrale_request_success_total", 'finished_reason="abort"')
    body = {"prompt": [7, 8, 9], "max_tokens": MAX_TOKENS, "ignore_eos": True, "n": 8}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=0.2)
    server.wait_idle()
    aborted = server.metric("metrale_request_success_total", 'finished_reason="abort"')
    assert aborted == aborted_before + 8
    assert server.engine.block_manager.num_free_blocks == server.engine.num_kv_blocks
