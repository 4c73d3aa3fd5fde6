"""The ``concurrency-sweep`` driver: ``serve`` at max concurrency 1, 2, 4, … N, all at once.

Each level sends ``prompts_per_concurrency × N`` requests (at least ``min_prompts``) with no
request rate, so N stay in flight. Metrics are each level's ``serve`` metrics prefixed
``c<N>_``, plus ``peak_output_tok_s`` and the concurrency that reached it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from metrale_bench.benchmarks.common import (
    as_params,
    identify,
    measured_load,
    target_params,
    warm_up,
)
from metrale_bench.benchmarks.serve import Workload, load_metrics
from metrale_bench.load import LoadSpec
from metrale_bench.metrics import Slo
from metrale_bench.records import BenchRecord, new_record
from metrale_bench.streaming import SamplingSpec
from metrale_bench.target import ServerTarget
from metrale_bench.types import MetricValue


def doubling_levels(max_concurrency: int) -> list[int]:
    """1, 2, 4, … up to ``max_concurrency``, which is always the last level."""
    if max_concurrency < 1:
        raise ValueError(f"max concurrency must be >= 1, got {max_concurrency}")
    levels = [1]
    while levels[-1] * 2 < max_concurrency:
        levels.append(levels[-1] * 2)
    if levels[-1] != max_concurrency:
        levels.append(max_concurrency)
    return levels


@attrs.frozen(kw_only=True)
class SweepSpec:
    """The levels, and how many requests each sends (the workload's ``num_prompts`` is not
    used)."""

    concurrencies: tuple[int, ...]
    prompts_per_concurrency: int = 4
    min_prompts: int = 4

    def num_prompts(self, concurrency: int) -> int:
        return max(self.min_prompts, self.prompts_per_concurrency * concurrency)


async def run_concurrency_sweep(
    target: ServerTarget,
    *,
    workload: Workload,
    sweep: SweepSpec,
    sampling: SamplingSpec,
    slo: Slo | None = None,
    num_warmups: int = 1,
    command: Sequence[str] = (),
    show_progress: bool = False,
) -> BenchRecord:
    identity = await identify(target)
    tokens_per_word = identity.prompt_tokens_per_word
    warmups = workload.requests(num_warmups, tokens_per_word=tokens_per_word)
    await warm_up(target, identity.model, warmups, sampling)
    metrics: dict[str, MetricValue] = {}
    samples: dict[str, list[float]] = {}
    num_failed = 0
    errors: list[str] = []
    for concurrency in sweep.concurrencies:
        requests = workload.requests(
            sweep.num_prompts(concurrency), tokens_per_word=tokens_per_word
        )
        result = await measured_load(
            target,
            identity.model,
            requests,
            load=LoadSpec(max_concurrency=concurrency, seed=workload.seed),
            sampling=sampling,
            label=f"concurrency {concurrency}",
            show_progress=show_progress,
        )
        level_metrics, level_samples = load_metrics(result, slo, prefix=f"c{concurrency}_")
        metrics.update(level_metrics)
        samples.update(level_samples)
        num_failed += result.num_failed
        errors += [e for e in result.errors() if e not in errors]
    peak = max(sweep.concurrencies, key=lambda c: metrics[f"c{c}_output_tok_s"] or 0.0)
    metrics["peak_output_tok_s"] = metrics[f"c{peak}_output_tok_s"]
    metrics["peak_output_concurrency"] = peak
    return new_record(
        benchmark="concurrency-sweep",
        command=command,
        base_url=target.base_url,
        model=identity.model,
        server_version=identity.version,
        params={
            **target_params(target),
            "workload": as_params(workload),
            "prompts": identity.prompt_params(),
            "sweep": as_params(sweep),
            "sampling": as_params(sampling),
            "slo": None if slo is None else as_params(slo),
            "num_warmups": num_warmups,
        },
        metrics=metrics,
        samples=samples,
        num_failed=num_failed,
        errors=errors[:5],
    )
