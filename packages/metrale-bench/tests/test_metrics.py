"""Every metric on a recorded fixture (tests/fixtures/recorded_outcomes.json), against values
worked out by hand in the comments."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from metrale_bench.metrics import (
    LatencySummary,
    Slo,
    compute_serve_metrics,
    latency_samples_ms,
    max_concurrent_requests,
    meets_slo,
    percentile,
    std,
    tpot_s,
)
from metrale_bench.outcome import RequestOutcome

FIXTURE = Path(__file__).parent / "fixtures" / "recorded_outcomes.json"


def _load() -> tuple[list[RequestOutcome], float]:
    data = json.loads(FIXTURE.read_text())
    outcomes = [
        RequestOutcome(**{**item, "itl_s": tuple(item["itl_s"])}) for item in data["outcomes"]
    ]
    return outcomes, data["duration_s"]


def test_throughputs_and_counts() -> None:
    outcomes, duration_s = _load()
    metrics = compute_serve_metrics(outcomes, duration_s)
    assert (metrics.num_requests, metrics.num_completed, metrics.num_failed) == (4, 3, 1)
    # Only the three successes count: 10 + 20 + 5 prompt, 4 + 3 + 1 output tokens.
    assert metrics.total_input_tokens == 35
    assert metrics.total_output_tokens == 8
    assert metrics.request_throughput == pytest.approx(3.0)
    assert metrics.output_throughput == pytest.approx(8.0)
    assert metrics.total_token_throughput == pytest.approx(43.0)
    # Σ latency of successes / duration = (0.2 + 0.4 + 0.3) / 1.0.
    assert metrics.mean_concurrency == pytest.approx(0.9)
    # [0, .2), [.05, .45), [.1, .4), [.2, .25): three overlap at 0.1 and again at 0.2.
    assert metrics.max_concurrent_requests == 3
    assert metrics.request_goodput is None


def test_ttft_summary() -> None:
    outcomes, duration_s = _load()
    ttft = compute_serve_metrics(outcomes, duration_s).ttft
    assert ttft is not None
    # [100, 200, 300] ms: std = sqrt((100² + 0 + 100²) / 3); p90 rank 1.8 → 200 + 0.8·100.
    assert ttft.mean_ms == pytest.approx(200.0)
    assert ttft.median_ms == pytest.approx(200.0)
    assert ttft.std_ms == pytest.approx(math.sqrt(20000 / 3))
    assert ttft.p90_ms == pytest.approx(280.0)
    assert ttft.p99_ms == pytest.approx(298.0)


def test_tpot_summary() -> None:
    outcomes, duration_s = _load()
    tpot = compute_serve_metrics(outcomes, duration_s).tpot
    assert tpot is not None
    # (200 − 100) / 3 = 33.33 ms and (400 − 200) / 2 = 100 ms; one output token has no TPOT.
    assert tpot.mean_ms == pytest.approx(200 / 3)
    assert tpot.median_ms == pytest.approx(200 / 3)
    assert tpot.std_ms == pytest.approx(100 / 3)
    assert tpot.p90_ms == pytest.approx(100 / 3 + 0.9 * 200 / 3)
    assert tpot.p99_ms == pytest.approx(100 / 3 + 0.99 * 200 / 3)


def test_itl_summary() -> None:
    outcomes, duration_s = _load()
    itl = compute_serve_metrics(outcomes, duration_s).itl
    assert itl is not None
    # Gaps [20, 30, 50, 100] ms: mean 50, median rank 1.5 → 40, variance (900+400+0+2500)/4.
    assert itl.mean_ms == pytest.approx(50.0)
    assert itl.median_ms == pytest.approx(40.0)
    assert itl.std_ms == pytest.approx(math.sqrt(950.0))
    assert itl.p90_ms == pytest.approx(85.0)
    assert itl.p99_ms == pytest.approx(98.5)


def test_e2e_summary() -> None:
    outcomes, duration_s = _load()
    e2e = compute_serve_metrics(outcomes, duration_s).e2e
    assert e2e is not None
    # [200, 300, 400] ms; the failed request's 50 ms is not a latency.
    assert e2e.mean_ms == pytest.approx(300.0)
    assert e2e.median_ms == pytest.approx(300.0)
    assert e2e.p90_ms == pytest.approx(380.0)
    assert e2e.p99_ms == pytest.approx(398.0)


@pytest.mark.parametrize(
    ("slo", "num_good"),
    [
        # R1 (100 ms, 33 ms/tok) passes; R2's TPOT 100 fails; R3's TTFT 300 fails.
        ("ttft:250,tpot:50", 1),
        # R1 200 and R3 300 (inclusive) pass; R2 400 fails.
        ("e2e:300", 2),
        # R3 has one output token, so its TPOT counts as 0 (vLLM's rule).
        ("tpot=40", 2),
        ("ttft:1000 tpot:1000 e2e:1000", 3),
    ],
)
def test_goodput(slo: str, num_good: int) -> None:
    outcomes, duration_s = _load()
    metrics = compute_serve_metrics(outcomes, duration_s, Slo.parse(slo))
    assert metrics.request_goodput == pytest.approx(num_good / duration_s)


def test_failed_request_never_meets_an_slo() -> None:
    outcomes, _ = _load()
    assert not meets_slo(outcomes[3], Slo(e2e_ms=1e9))


def test_flat_names_and_prefix() -> None:
    outcomes, duration_s = _load()
    flat = compute_serve_metrics(outcomes, duration_s).flat("c4_")
    assert flat["c4_output_tok_s"] == pytest.approx(8.0)
    assert flat["c4_ttft_p50_ms"] == pytest.approx(200.0)
    assert flat["c4_itl_p99_ms"] == pytest.approx(98.5)
    assert flat["c4_num_failed"] == 1
    assert flat["c4_goodput_request_s"] is None
    assert all(name.startswith("c4_") for name in flat)


def test_all_failed_run_has_no_latencies() -> None:
    failed = RequestOutcome(start_s=0.0, latency_s=0.1, error="HTTP 500")
    metrics = compute_serve_metrics([failed, failed], 2.0)
    assert metrics.num_failed == 2
    assert metrics.output_throughput == 0.0
    assert metrics.ttft is None
    assert metrics.flat()["tpot_p99_ms"] is None


def test_samples_are_milliseconds_of_successes() -> None:
    outcomes, _ = _load()
    samples = latency_samples_ms(outcomes)
    assert samples["ttft_ms"] == [100.0, 200.0, 300.0]
    assert samples["e2e_ms"] == [200.0, 400.0, 300.0]
    assert samples["tpot_ms"] == [pytest.approx(33.333), pytest.approx(100.0)]


def test_tpot_needs_two_tokens() -> None:
    one = RequestOutcome(start_s=0, latency_s=1.0, ttft_s=0.5, output_tokens=1)
    two = RequestOutcome(start_s=0, latency_s=1.0, ttft_s=0.5, output_tokens=2)
    assert tpot_s(one) is None
    assert tpot_s(two) == pytest.approx(0.5)


def test_percentile_matches_linear_interpolation() -> None:
    values = [15.0, 20.0, 35.0, 40.0, 50.0]
    assert percentile(values, 0) == 15.0
    assert percentile(values, 100) == 50.0
    assert percentile(values, 40) == pytest.approx(29.0)  # rank 1.6: 20 + 0.6·15
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="outside"):
        percentile(values, 101)


def test_std_is_population() -> None:
    assert std([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]) == pytest.approx(2.0)


def test_touching_intervals_do_not_overlap() -> None:
    a = RequestOutcome(start_s=0.0, latency_s=1.0)
    b = RequestOutcome(start_s=1.0, latency_s=1.0)
    assert max_concurrent_requests([a, b]) == 1
    assert max_concurrent_requests([]) == 0


def test_summary_of_nothing_is_none() -> None:
    assert LatencySummary.of_seconds([]) is None


@pytest.mark.parametrize("text", ["ttft", "speed:3", "ttft:fast", "ttft:-1"])
def test_bad_slo_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="SLO"):
        Slo.parse(text)


def test_zero_duration_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        compute_serve_metrics([], 0.0)
