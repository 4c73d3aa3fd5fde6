from __future__ import annotations

from pathlib import Path

from metrale_bench.plots import plot_record
from metrale_bench.records import new_record
from metrale_bench.sweep import sweep_levels

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_serve_record_draws_latency_cdfs(tmp_path: Path) -> None:
    record = new_record(
        benchmark="serve",
        command=[],
        base_url="u",
        model="m",
        server_version=None,
        params={},
        metrics={"output_tok_s": 1.0},
        samples={"ttft_ms": [1.0, 3.0, 2.0], "tpot_ms": [0.5, 0.7], "e2e_ms": [5.0, 9.0, 7.0]},
    )
    path = plot_record(record, tmp_path / "serve.png")
    assert path.read_bytes().startswith(PNG_MAGIC)
    assert path.stat().st_size > 10_000


def test_sweep_record_draws_against_concurrency(tmp_path: Path) -> None:
    metrics: dict[str, float | int | None] = {}
    samples = {}
    for level in (1, 2, 4):
        metrics[f"c{level}_output_tok_s"] = 10.0 * level
        metrics[f"c{level}_tpot_p50_ms"] = 5.0 + level
        metrics[f"c{level}_tpot_p90_ms"] = 6.0 + level
        metrics[f"c{level}_tpot_p99_ms"] = None
        samples[f"c{level}_ttft_ms"] = [1.0 * level, 2.0 * level]
    metrics["peak_output_tok_s"] = 40.0
    record = new_record(
        benchmark="concurrency-sweep",
        command=[],
        base_url="u",
        model="m",
        server_version=None,
        params={},
        metrics=metrics,
        samples=samples,
    )
    assert sweep_levels(record) == [1, 2, 4]
    path = plot_record(record, tmp_path / "sweep.png")
    assert path.read_bytes().startswith(PNG_MAGIC)
