"""Fixed snapshots for the render tests (no server needed): ``snapshot`` and ``make_view``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from metrale_bench.wire import MemoryReport
from metrale_server.api.recent_requests import FinishedRequest
from metrale_server.tui.histogram import BucketCounts
from metrale_server.tui.history import RateSample
from metrale_server.tui.metrics_reading import MetricsReading
from metrale_server.tui.snapshot import ServerInfo, Snapshot, Status
from metrale_server.tui.view import DashboardView, Page

SERVER = ServerInfo(
    model="SmolLM2-135M-Instruct.Q4_1",
    dtype="float32",
    device="cpu",
    num_kv_blocks=512,
    block_size=16,
    max_batch_size=64,
    max_seq_len=8192,
    started_at=1_000.0,
    is_prefix_caching=True,
)
METRICS = MetricsReading(
    num_running=3,
    num_waiting=2,
    kv_usage=0.25,
    num_prompt_tokens=1_000,
    num_generation_tokens=500,
    num_prefix_queried_tokens=400,
    num_prefix_hit_tokens=100,
    num_preemptions=1,
    num_finished_by_reason={"stop": 4, "length": 2},
    ttft=BucketCounts(upper_bounds=(0.1, 1.0, math.inf), cumulative_counts=(2.0, 6.0, 6.0)),
    tpot=BucketCounts(upper_bounds=(0.01, 0.1, math.inf), cumulative_counts=(1.0, 6.0, 6.0)),
)
MEMORY = MemoryReport(
    kv_blocks=512,
    kv_block_bytes=4096,
    max_batch_size=64,
    budget_bytes=2**30,
    ledger_live_bytes=3 * 2**20,
    mem_available_at_start_bytes=None,
    mem_available_now_bytes=None,
    rss_anon_bytes=None,
    device="cpu",
    total_bytes=2**34,
    gpu_memory_utilization=0.9,
    block_size=16,
    max_seq_len=8192,
    kv_bytes_per_token=256,
    plan_by_owner={"weights": 2**20, "kv_cache": 2 * 2**20},
    ledger_by_owner={"weights": 2**20, "kv_cache": 2 * 2**20},
)
RECENT = tuple(
    FinishedRequest(
        request_id=f"cmpl-{i:02d}-0123456789abcdef",
        num_prompt_tokens=10 + i,
        num_completion_tokens=40 + i,
        latency_s=0.5 + i / 10,
        finish_reason="length" if i % 2 else "stop",
        finished_at=2_000.0 + i,
    )
    for i in range(12)
)
SNAPSHOT = Snapshot(
    url="http://127.0.0.1:8888",
    status=Status.SERVING,
    taken_at=50.0,
    model=SERVER.model,
    server=SERVER,
    metrics=METRICS,
    memory=MEMORY,
    recent_requests=RECENT,
    version="0.1.0",
)
RATES = tuple(
    RateSample(at=float(i), prompt_tokens_per_s=10.0 * i, generation_tokens_per_s=25.0 * (i % 5))
    for i in range(60)
)
LOG_LINES = tuple(
    f"12:00:{i:02d} INFO    cmpl-{i:02d} prompt_tokens=12 completion_tokens=40 latency=0.8s "
    "finish_reason=length"
    for i in range(40)
)


def serving_view(**changes: Any) -> DashboardView:
    view = DashboardView(
        snapshot=SNAPSHOT,
        rates=RATES,
        log_lines=LOG_LINES,
        page=Page.OVERVIEW,
        uptime_s=3_725.0,
    )
    return attrs.evolve(view, **changes)


@pytest.fixture
def snapshot() -> Snapshot:
    """A serving server with metrics, memory and 12 finished requests (newest first)."""
    return SNAPSHOT


@pytest.fixture
def make_view() -> Callable[..., DashboardView]:
    """``make_view(**changes)``: the serving snapshot's view, up 01:02:05, on the overview."""
    return serving_view
