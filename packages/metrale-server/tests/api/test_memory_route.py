"""``GET /memory`` end to end: every ``MemoryReport`` field with its type, host readings present
on this Linux machine, KV numbers equal to ``/metrics``, the ledger equal to the plan and
unchanged by serving requests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from metrale_bench.server_process import ServerProcess
from metrale_bench.wire import MemoryReport
from metrale_model_arch.memory import RUNTIME_HEADROOM
from metrale_server import EngineArgs, build_engine
from metrale_server.memory.host_memory import physical_memory_bytes, record_mem_available_at_start

INT_FIELDS = (
    "kv_blocks",
    "kv_block_bytes",
    "max_batch_size",
    "budget_bytes",
    "total_bytes",
    "block_size",
    "max_seq_len",
    "kv_bytes_per_token",
    "version",
)
HOST_FIELDS = (
    "ledger_live_bytes",
    "mem_available_at_start_bytes",
    "mem_available_now_bytes",
    "rss_anon_bytes",
)
MAX_SEQ_LEN = 128
MAX_BATCH_SIZE = 4


@pytest.fixture(scope="module")
def memory_server(
    tiny_model_dir: Path, serve_engine: Callable[..., AbstractContextManager[Any]]
) -> Iterator[Any]:
    record_mem_available_at_start()  # as ``met serve``'s preflight does, before loading
    engine = build_engine(
        EngineArgs(
            model=str(tiny_model_dir),
            dtype="float32",
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=MAX_BATCH_SIZE,
        )
    )
    with serve_engine(engine) as running:
        yield running


def get_memory(client: httpx.Client) -> dict[str, Any]:
    response = client.get("/memory")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    document = response.json()
    assert isinstance(document, dict)
    return document


def assert_report_shape(document: dict[str, Any]) -> None:
    assert set(document) == {field.name for field in attrs.fields(MemoryReport)}
    for name in INT_FIELDS + HOST_FIELDS:
        value = document[name]
        assert type(value) is int, (name, value)
        assert value > 0, (name, value)
    assert isinstance(document["gpu_memory_utilization"], float)
    assert isinstance(document["device"], str)
    for name in ("plan_by_owner", "ledger_by_owner"):
        owners = document[name]
        assert isinstance(owners, dict), name
        assert owners, name
        assert all(type(k) is str for k in owners), name
        assert all(type(v) is int for v in owners.values()), name


def test_every_field_is_present_with_its_type(memory_server: Any) -> None:
    document = get_memory(memory_server.client)
    assert_report_shape(document)
    assert document["device"] == "cpu"
    assert document["gpu_memory_utilization"] == 0.9
    assert document["block_size"] == 16
    assert document["max_seq_len"] == MAX_SEQ_LEN
    assert document["max_batch_size"] == MAX_BATCH_SIZE
    physical = physical_memory_bytes()  # MemAvailable is host-wide; a cgroup may cap the total
    assert physical is not None
    assert document["mem_available_now_bytes"] <= physical
    assert document["mem_available_at_start_bytes"] <= physical


def test_the_report_round_trips_through_from_json(memory_server: Any) -> None:
    document = get_memory(memory_server.client)
    report = MemoryReport.from_json(document)
    assert report.to_json() == document
    assert report.max_kv_tokens == document["kv_blocks"] * 16
    assert isinstance(report.mem_available_drop_bytes, int)


def test_the_report_matches_the_engine_plan_and_ledger(memory_server: Any) -> None:
    document = get_memory(memory_server.client)
    engine = memory_server.engine
    plan = engine.plan
    assert document["kv_blocks"] == engine.num_kv_blocks == MAX_BATCH_SIZE * MAX_SEQ_LEN // 16
    assert document["kv_block_bytes"] == plan.kv_block_bytes == 16 * 2 * 2 * 2 * 16 * 4
    assert document["kv_bytes_per_token"] == plan.kv_bytes_per_token
    assert document["budget_bytes"] == plan.budget_bytes
    assert document["total_bytes"] == plan.inputs.total_bytes
    assert document["plan_by_owner"] == plan.by_owner()
    assert document["ledger_by_owner"] == plan.allocated_by_owner()
    assert document["ledger_by_owner"] == {
        owner: size
        for owner, size in document["plan_by_owner"].items()
        if size > 0 and owner != RUNTIME_HEADROOM
    }
    assert document["ledger_live_bytes"] == sum(document["ledger_by_owner"].values())
    assert document["budget_bytes"] == int(
        document["total_bytes"] * document["gpu_memory_utilization"]
    )


def test_kv_numbers_equal_the_metrics_gauges(memory_server: Any) -> None:
    document = get_memory(memory_server.client)
    metric = memory_server.metric
    assert metric("metrale_kv_cache_blocks_total") == document["kv_blocks"]
    assert metric("metrale_kv_cache_block_bytes") == document["kv_block_bytes"]
    assert metric("metrale_memory_budget_bytes") == document["budget_bytes"]
    for owner, size in document["ledger_by_owner"].items():
        assert metric("metrale_memory_ledger_bytes", f'owner="{owner}"') == size, owner
    text = memory_server.client.get("/metrics").text
    owners = {
        line.split('owner="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("metrale_memory_ledger_bytes{")
    }
    assert owners == set(document["ledger_by_owner"])


def test_the_ledger_is_unchanged_after_requests(memory_server: Any) -> None:
    before = get_memory(memory_server.client)
    for prompt in ("Hello", "The capital of France is", "1 2 3 4 5"):
        response = memory_server.client.post(
            "/v1/completions",
            json={"model": "tiny-llama", "prompt": prompt, "max_tokens": 12, "temperature": 0},
        )
        assert response.status_code == 200, response.text
    memory_server.wait_idle()
    after = get_memory(memory_server.client)
    assert after["ledger_by_owner"] == before["ledger_by_owner"]
    assert after["ledger_live_bytes"] == before["ledger_live_bytes"]
    assert after["plan_by_owner"] == before["plan_by_owner"]
    assert after["mem_available_at_start_bytes"] == before["mem_available_at_start_bytes"]
    assert_report_shape(after)


def test_memory_on_a_met_serve_process(tiny_model_dir: Path) -> None:
    """The real ``met serve``: its preflight samples MemAvailable before loading."""
    server = ServerProcess.start(
        [str(tiny_model_dir), "--max-seq-len", "64", "--max-batch-size", "2", "--no-tui"]
    )
    try:
        server.wait_ready(timeout_s=60)
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            document = get_memory(client)
            metrics = client.get("/metrics").text
    finally:
        server.stop()
        server.log_path.unlink(missing_ok=True)
    assert_report_shape(document)
    assert document["kv_blocks"] == 2 * 64 // 16
    assert document["ledger_by_owner"] == {
        owner: size
        for owner, size in document["plan_by_owner"].items()
        if size > 0 and owner != RUNTIME_HEADROOM
    }
    blocks_line = next(
        line for line in metrics.splitlines() if line.startswith("metrale_kv_cache_blocks_total{")
    )
    assert float(blocks_line.rsplit(" ", 1)[1]) == document["kv_blocks"]
