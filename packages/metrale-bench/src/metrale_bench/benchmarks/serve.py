"""The ``serve`` driver, like ``vllm bench serve``: one load, its latencies and throughputs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import attrs

from metrale_bench.benchmarks.common import (
    as_params,
    identify,
    measured_load,
    target_params,
    warm_up,
)
from metrale_bench.datasets import BenchRequest, random_requests, sharegpt_requests
from metrale_bench.load import LoadResult, LoadSpec
from metrale_bench.metrics import Slo, compute_serve_metrics, latency_samples_ms
from metrale_bench.records import BenchRecord, new_record
from metrale_bench.streaming import SamplingSpec
from metrale_bench.target import ServerTarget
from metrale_bench.types import MetricValue

Dataset = Literal["random", "sharegpt"]


@attrs.frozen(kw_only=True)
class Workload:
    """Which prompts a run sends: ``random`` (text prompts of about ``random_input_len`` tokens,
    see :mod:`metrale_bench.datasets`, with a range ratio) or a ShareGPT JSON file."""

    dataset: Dataset = "random"
    dataset_path: Path | None = None
    num_prompts: int = 100
    random_input_len: int = 128
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    sharegpt_output_len: int | None = None
    seed: int = 0

    def requests(
        self, num_prompts: int | None = None, *, tokens_per_word: float = 1.0
    ) -> list[BenchRequest]:
        """The first ``num_prompts`` (default ``self.num_prompts``) requests; random prompts
        are sized at ``tokens_per_word`` tokens per word."""
        count = self.num_prompts if num_prompts is None else num_prompts
        if self.dataset == "sharegpt":
            if self.dataset_path is None:
                raise ValueError("the sharegpt dataset needs a dataset path")
            return sharegpt_requests(
                self.dataset_path,
                num_requests=count,
                output_len=self.sharegpt_output_len,
                seed=self.seed,
            )
        return random_requests(
            num_requests=count,
            input_len=self.random_input_len,
            output_len=self.random_output_len,
            range_ratio=self.random_range_ratio,
            seed=self.seed,
            tokens_per_word=tokens_per_word,
        )


def load_metrics(
    result: LoadResult, slo: Slo | None, prefix: str = ""
) -> tuple[dict[str, MetricValue], dict[str, list[float]]]:
    """A load's flat metrics and latency samples, with names prefixed by ``prefix``."""
    metrics = compute_serve_metrics(result.outcomes, result.duration_s, slo).flat(prefix)
    samples = {f"{prefix}{k}": v for k, v in latency_samples_ms(result.outcomes).items()}
    return metrics, samples


async def run_serve(
    target: ServerTarget,
    *,
    workload: Workload,
    load: LoadSpec,
    sampling: SamplingSpec,
    slo: Slo | None = None,
    num_warmups: int = 0,
    command: Sequence[str] = (),
    show_progress: bool = False,
) -> BenchRecord:
    """Run one load against ``target`` and record it; failed requests are counted in the
    record (``num_failed``), never raised."""
    identity = await identify(target)
    requests = workload.requests(tokens_per_word=identity.prompt_tokens_per_word)
    await warm_up(target, identity.model, requests[:num_warmups], sampling)
    result = await measured_load(
        target,
        identity.model,
        requests,
        load=load,
        sampling=sampling,
        label="serve",
        show_progress=show_progress,
    )
    metrics, samples = load_metrics(result, slo)
    return new_record(
        benchmark="serve",
        command=command,
        base_url=target.base_url,
        model=identity.model,
        server_version=identity.version,
        params={
            **target_params(target),
            "workload": as_params(workload),
            "prompts": identity.prompt_params(),
            "load": as_params(load),
            "sampling": as_params(sampling),
            "slo": None if slo is None else as_params(slo),
            "num_warmups": num_warmups,
        },
        metrics=metrics,
        samples=samples,
        num_failed=result.num_failed,
        errors=result.errors(),
    )
