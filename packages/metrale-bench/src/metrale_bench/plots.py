"""One PNG per record (matplotlib, Agg backend): latency CDFs; for a concurrency sweep, also
output throughput and TPOT against concurrency. matplotlib comes with the ``plots`` extra
(``pip install 'metrale-bench[plots]'``); nothing else imports this module at start."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from metrale_bench.records import BenchRecord
from metrale_bench.sweep import sweep_levels


def _cdf(axes: Axes, values: Sequence[float], label: str) -> None:
    ordered = sorted(values)
    fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
    axes.step(ordered, fractions, where="post", label=label)


def _cdf_panel(axes: Axes, title: str, curves: dict[str, Sequence[float]]) -> None:
    for label, values in curves.items():
        if values:
            _cdf(axes, values, label)
    axes.set_title(title)
    axes.set_xlabel("ms")
    axes.set_ylabel("fraction of requests")
    axes.set_ylim(0, 1.02)
    axes.grid(alpha=0.3)
    if len(curves) > 1:
        axes.legend(fontsize="small")


def _plot_sweep(record: BenchRecord, figure: Figure) -> None:
    levels = sweep_levels(record)
    throughput, tpot, ttft = figure.subplots(1, 3)
    tok_s = [record.metrics.get(f"c{c}_output_tok_s") for c in levels]
    throughput.plot(levels, [v if v is not None else float("nan") for v in tok_s], marker="o")
    throughput.set_title("output throughput")
    throughput.set_ylabel("tokens / s")
    for stat in ("p50", "p90", "p99"):
        values = [record.metrics.get(f"c{c}_tpot_{stat}_ms") for c in levels]
        tpot.plot(
            levels, [v if v is not None else float("nan") for v in values], marker="o", label=stat
        )
    tpot.set_title("TPOT")
    tpot.set_ylabel("ms")
    tpot.legend(fontsize="small")
    for axes in (throughput, tpot):
        axes.set_xscale("log", base=2)
        axes.set_xticks(levels, [str(c) for c in levels])
        axes.set_xlabel("max concurrency")
        axes.grid(alpha=0.3)
    _cdf_panel(
        ttft, "TTFT CDF", {f"c={c}": record.samples.get(f"c{c}_ttft_ms", ()) for c in levels}
    )


def plot_record(record: BenchRecord, path: Path) -> Path:
    """Draw ``record`` into the PNG at ``path`` and return ``path``."""
    figure = plt.figure(figsize=(15, 4.5), layout="constrained")
    try:
        if record.benchmark == "concurrency-sweep":
            _plot_sweep(record, figure)
        else:
            names = [name for name, values in record.samples.items() if values]
            panels = figure.subplots(1, max(1, len(names)), squeeze=False)[0]
            for axes, name in zip(panels, names, strict=False):
                _cdf_panel(axes, f"{name.removesuffix('_ms')} CDF", {name: record.samples[name]})
        figure.suptitle(
            f"{record.benchmark} · {record.model} · {record.recorded_at} · "
            f"{(record.git.sha or 'nogit')[:10]}"
        )
        figure.savefig(path, dpi=100)
    finally:
        plt.close(figure)
    return path
