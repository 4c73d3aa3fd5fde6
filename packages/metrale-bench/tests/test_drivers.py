"""Each driver against the fake server (the harness is not tied to metrale)."""

from __future__ import annotations

import asyncio

import pytest

from metrale_bench.benchmarks.concurrency_sweep import (
    SweepSpec,
    doubling_levels,
    run_concurrency_sweep,
)
from metrale_bench.benchmarks.decode_floor import DecodeFloorSpec, run_decode_floor
from metrale_bench.benchmarks.default_tier_boot import (
    TierBootSpec,
    memory_metrics,
    run_default_tier_boot,
)
from metrale_bench.benchmarks.serve import Workload, run_serve
from metrale_bench.benchmarks.ttft import TtftSpec, run_ttft, ttft_requests
from metrale_bench.load import LoadSpec
from metrale_bench.metrics import Slo
from metrale_bench.streaming import SamplingSpec
from metrale_bench.target import ServerTarget
from metrale_bench.wire import MemoryReport


def test_serve_records_every_metric(fake_server_url: str) -> None:
    target = ServerTarget(base_url=fake_server_url)
    record = asyncio.run(
        run_serve(
            target,
            workload=Workload(num_prompts=6, random_input_len=20, random_output_len=6),
            load=LoadSpec(max_concurrency=3),
            sampling=SamplingSpec(),
            slo=Slo(ttft_ms=10_000),
            num_warmups=1,
            command=["met", "bench", "serve"],
        )
    )
    assert record.benchmark == "serve"
    assert record.model == "fake-model"
    assert record.server_version == {"version": "fake-0.0.1"}
    assert record.num_failed == 0
    assert record.metrics["num_completed"] == 6
    # The fake tokenizer makes two tokens a word: /tokenize says so, prompts are 10 words.
    assert record.params["prompts"] == {"tokens_per_word": 2.0, "sized_by": "/tokenize"}
    assert record.metrics["total_input_tokens"] == 6 * 20
    assert record.metrics["mean_input_tokens"] == 20
    assert record.metrics["total_output_tokens"] == 6 * 6
    assert record.metrics["max_concurrent_requests"] == 3
    assert record.metrics["goodput_request_s"] == pytest.approx(record.metrics["request_s"])
    assert record.params["load"]["max_concurrency"] == 3
    assert len(record.samples["ttft_ms"]) == 6


def test_serve_without_tokenize_sizes_prompts_a_token_a_word(fake_server_url: str) -> None:
    target = ServerTarget(base_url=fake_server_url, model="no-tokenize")
    record = asyncio.run(
        run_serve(
            target,
            workload=Workload(num_prompts=2, random_input_len=20, random_output_len=2),
            load=LoadSpec(),
            sampling=SamplingSpec(),
        )
    )
    assert record.params["prompts"] == {"tokens_per_word": 1.0, "sized_by": "words"}
    # 20 words at the fake's two tokens a word: the record holds what the server counted.
    assert record.metrics["mean_input_tokens"] == 40


def test_serve_counts_failures(fake_server_url: str) -> None:
    target = ServerTarget(base_url=fake_server_url, model="broken")
    record = asyncio.run(
        run_serve(target, workload=Workload(num_prompts=3), load=LoadSpec(),
                  sampling=SamplingSpec())
    )  # fmt: skip
    assert record.num_failed == 3
    assert record.metrics["num_completed"] == 0
    assert record.errors
    assert "HTTP 500" in record.errors[0]


def test_concurrency_sweep(fake_server_url: str) -> None:
    target = ServerTarget(base_url=fake_server_url, api="chat")
    record = asyncio.run(
        run_concurrency_sweep(
            target,
            workload=Workload(random_input_len=10, random_output_len=4),
            sweep=SweepSpec(concurrencies=(1, 2, 4), prompts_per_concurrency=2),
            sampling=SamplingSpec(),
        )
    )
    for level in (1, 2, 4):
        assert record.metrics[f"c{level}_num_completed"] == max(4, 2 * level)
        assert record.metrics[f"c{level}_max_concurrent_requests"] == level
        assert len(record.samples[f"c{level}_ttft_ms"]) == max(4, 2 * level)
    peak = record.metrics["peak_output_concurrency"]
    assert record.metrics["peak_output_tok_s"] == record.metrics[f"c{peak}_output_tok_s"]


def test_doubling_levels() -> None:
    assert doubling_levels(1) == [1]
    assert doubling_levels(16) == [1, 2, 4, 8, 16]
    assert doubling_levels(12) == [1, 2, 4, 8, 12]


def test_decode_floor(fake_server_url: str, fake_delays_s: tuple[float, float]) -> None:
    target = ServerTarget(base_url=fake_server_url)
    spec = DecodeFloorSpec(input_len=8, output_len=20, runs=2)
    record = asyncio.run(run_decode_floor(target, spec=spec))
    assert record.metrics["runs"] == 2
    assert record.metrics["min_output_tokens"] == 20
    decode = record.metrics["decode_tok_s"]
    # The fake server sleeps 2 ms between tokens, so no more than 500 tokens/s.
    assert decode is not None
    assert 0 < decode <= 1.0 / fake_delays_s[1]
    assert record.metrics["client_tpot_p50_ms"] == pytest.approx(1000.0 / decode)


def test_ttft_requests_share_a_prefix() -> None:
    spec = TtftSpec(prefix_len=20, suffix_len=6, runs=2)
    cold, prime, warm = ttft_requests(spec, tokens_per_word=2.0)
    words = {r: str(r.prompt).split() for r in [*cold, prime, *warm]}
    assert all(len(w) == 13 for w in words.values())
    assert all(words[r][:10] == words[prime][:10] for r in warm)
    assert words[cold[0]][:10] != words[cold[1]][:10]
    assert len({r.prompt for r in [*warm, prime]}) == 3


def test_ttft(fake_server_url: str) -> None:
    target = ServerTarget(base_url=fake_server_url)
    record = asyncio.run(run_ttft(target, spec=TtftSpec(prefix_len=16, suffix_len=4, runs=2)))
    assert record.num_failed == 0
    assert record.metrics["ttft_cold_p50_ms"] is not None
    assert record.metrics["ttft_warm_p50_ms"] is not None
    assert record.metrics["warm_over_cold"] == pytest.approx(
        record.metrics["ttft_warm_p50_ms"] / record.metrics["ttft_cold_p50_ms"]
    )
    assert len(record.samples["ttft_cold_ms"]) == 2


def test_default_tier_boot_reads_memory(fake_server_url: str) -> None:
    target = ServerTarget(base_url=fake_server_url)
    spec = TierBootSpec(num_chats=3, prompt_words=16, max_tokens=5)
    record = asyncio.run(run_default_tier_boot(target, spec=spec))
    assert record.num_failed == 0
    assert record.params["api"] == "chat"
    assert record.metrics["kv_blocks"] == 64
    assert record.metrics["chat_num_completed"] == 3
    assert record.metrics["chat_total_output_tokens"] == 15
    assert record.details["verdict"] == "info"
    assert record.details["memory"]["budget_bytes"] == 512 << 20


def test_memory_metrics_by_hand() -> None:
    mib = 1 << 20
    report = MemoryReport(
        kv_blocks=64,
        kv_block_bytes=2 * mib,
        max_batch_size=8,
        budget_bytes=512 * mib,
        ledger_live_bytes=300 * mib,
        mem_available_at_start_bytes=10_000 * mib,
        mem_available_now_bytes=9_400 * mib,
        rss_anon_bytes=650 * mib,
        device="cpu",
        total_bytes=16_000 * mib,
        gpu_memory_utilization=0.9,
        block_size=16,
        max_seq_len=2048,
        kv_bytes_per_token=128 * 1024,
    )
    # Footprint: 10000 − 9400 = 600 MiB of MemAvailable; over the 512 MiB budget by 88.
    assert memory_metrics(report) == {
        "kv_blocks": 64,
        "max_kv_tokens": 1024,
        "max_batch_size": 8,
        "budget_mib": 512.0,
        "device_footprint_mib": 600.0,
        "footprint_over_budget_mib": 88.0,
        "ledger_live_mib": 300.0,
        "rss_anon_mib": 650.0,
    }
    unread = MemoryReport(**{**report.to_json(), "mem_available_now_bytes": None})
    assert memory_metrics(unread)["device_footprint_mib"] is None
    assert memory_metrics(unread)["footprint_over_budget_mib"] is None
    assert set(memory_metrics(None).values()) == {None}
