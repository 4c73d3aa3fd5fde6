"""Models, health, version, tokenize / detokenize, the 501 stubs, draining and ``/metrics``."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import pytest

from metrale_server.api import ServerMetrics

METRIC_NAMES = [
    "metrale_num_requests_running",
    "metrale_num_requests_waiting",
    "metrale_kv_cache_usage_perc",
    "metrale_prompt_tokens_total",
    "metrale_prompt_tokens_cached_total",
    "metrale_generation_tokens_total",
    "metrale_time_to_first_token_seconds_bucket",
    "metrale_time_per_output_token_seconds_bucket",
    "metrale_e2e_request_latency_seconds_bucket",
    "metrale_prefix_cache_queries_total",
    "metrale_prefix_cache_hits_total",
    "metrale_num_preemptions_total",
    "metrale_request_success_total",
]


def test_models_lists_the_served_model(server: Any) -> None:
    body = server.client.get("/v1/models").json()
    assert body["object"] == "list"
    [model] = body["data"]
    assert model["id"] == "tiny-llama"
    assert model["object"] == "model"
    assert model["max_model_len"] == server.engine.max_seq_len
    assert server.client.get("/v1/models/tiny-llama").json() == model
    missing = server.client.get("/v1/models/other")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


def test_health_follows_ready_and_draining(server: Any) -> None:
    client = server.client
    ready = client.get("/health")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "model": "tiny-llama"}
    with server.overridden(is_ready=False):
        assert client.get("/health").status_code == 503
        assert client.get("/health").json()["status"] == "loading"
        assert client.get("/health/live").status_code == 200
    with server.overridden(is_draining=True):
        assert client.get("/health").status_code == 503
        assert client.get("/health").json()["status"] == "draining"
        assert client.get("/health/live").status_code == 200
        refused = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "server_shutting_down"
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        assert client.post("/v1/chat/completions", json=chat).status_code == 503
    assert client.get("/health").status_code == 200


def test_version(server: Any) -> None:
    assert server.client.get("/version").json() == {"version": version("metrale-server")}


def test_tokenize_detokenize_round_trip(server: Any) -> None:
    text = "Hello, wörld! 你好 🙂"
    tokenized = server.client.post(
        "/tokenize", json={"prompt": text, "add_special_tokens": False}
    ).json()
    assert tokenized["count"] == len(tokenized["tokens"]) > 0
    assert tokenized["max_model_len"] == server.engine.max_seq_len
    assert tokenized["tokens"] == server.engine.loaded.tokenizer.encode(
        text, add_special_tokens=False
    )
    detokenized = server.client.post("/detokenize", json={"tokens": tokenized["tokens"]})
    assert detokenized.json() == {"prompt": text}
    messages = [{"role": "user", "content": "Hi"}]
    chat = server.client.post("/tokenize", json={"messages": messages}).json()
    rendered = server.engine.loaded.render_chat(messages)
    assert chat["tokens"] == server.engine.loaded.tokenizer.encode(
        rendered, add_special_tokens=False
    )
    bad = server.client.post("/detokenize", json={"tokens": [1, "x"]})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "tokens"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/moderations"),
        ("GET", "/v1/files"),
        ("POST", "/v1/files"),
        ("DELETE", "/v1/files/file-123"),
        ("POST", "/v1/batches"),
        ("GET", "/v1/batches/batch-1/cancel"),
        ("POST", "/v1/audio/transcriptions"),
        ("POST", "/v1/images/generations"),
    ],
)
def test_unserved_openai_endpoints_are_501(server: Any, method: str, path: str) -> None:
    response = server.client.request(method, path, json={})
    assert response.status_code == 501
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "not_implemented"
    assert path in error["message"]


def test_each_app_has_its_own_registry(server: Any) -> None:
    first = ServerMetrics(server.state.engine, "a")
    second = ServerMetrics(server.state.engine, "b")
    first.count_finished("stop")
    assert b'metrale_request_success_total{finished_reason="stop",model_name="a"} 1.0' in (
        first.render()
    )
    assert b"metrale_request_success_total{" not in second.render()


def test_metrics_names_and_counts_move(server: Any) -> None:
    server.wait_idle()
    text = server.client.get("/metrics").text
    for name in METRIC_NAMES:
        assert name in text, name
    before = {
        name: server.metric(name)
        for name in (
            "metrale_prompt_tokens_total",
            "metrale_generation_tokens_total",
            "metrale_e2e_request_latency_seconds_count",
            "metrale_time_to_first_token_seconds_count",
        )
    }
    length_before = server.metric("metrale_request_success_total", 'finished_reason="length"')
    body = {"prompt": [11, 12, 13, 14], "max_tokens": 6, "ignore_eos": True, "n": 2}
    assert server.client.post("/v1/completions", json=body).status_code == 200
    # Once per request, however many outputs it asks for.
    assert server.metric("metrale_prompt_tokens_total") == before["metrale_prompt_tokens_total"] + 4
    assert (
        server.metric("metrale_generation_tokens_total")
        == before["metrale_generation_tokens_total"] + 12
    )
    assert (
        server.metric("metrale_e2e_request_latency_seconds_count")
        == before["metrale_e2e_request_latency_seconds_count"] + 1
    )
    assert (
        server.metric("metrale_time_to_first_token_seconds_count")
        == before["metrale_time_to_first_token_seconds_count"] + 1
    )
    assert (
        server.metric("metrale_request_success_total", 'finished_reason="length"')
        == length_before + 2
    )
    assert server.metric("metrale_num_requests_running") == 0
    assert server.metric("metrale_kv_cache_usage_perc") == 0.0


def test_prompt_tokens_count_cached_ones_too(server: Any) -> None:
    # Prefix caching is on by default: the second request reuses the first one's full blocks.
    server.wait_idle()
    total_before = server.metric("metrale_prompt_tokens_total")
    cached_before = server.metric("metrale_prompt_tokens_cached_total")
    body = {"prompt": " ".join(f"metric{i}" for i in range(40)), "max_tokens": 2}
    usages = [server.client.post("/v1/completions", json=body).json()["usage"] for _ in range(2)]
    num_prompt = usages[0]["prompt_tokens"]
    cached = usages[1]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 16
    assert server.metric("metrale_prompt_tokens_total") == total_before + 2 * num_prompt
    assert server.metric("metrale_prompt_tokens_cached_total") == cached_before + cached
