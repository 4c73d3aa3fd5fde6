"""The ``ttft`` driver: time to first token for a cold prompt vs one sharing a warm prefix.

All requests go one at a time and have about the same length, ``prefix_len + suffix_len``
tokens of random words (sized like the random dataset's, see :mod:`metrale_bench.datasets`).
Cold prompts are fresh random ones (nothing to reuse); warm ones share a ``prefix_len`` prefix
that one unmeasured request sent first, each with its own suffix. A server that caches
prefixes answers the warm ones sooner: ``warm_over_cold`` is the ratio of median TTFTs (below
1 means the cache helped).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

from metrale_bench.benchmarks.common import (
    as_params,
    identify,
    measured_load,
    target_params,
    warm_up,
)
from metrale_bench.datasets import BenchRequest, random_text, words_for_tokens
from metrale_bench.load import LoadResult, LoadSpec
from metrale_bench.metrics import MS_PER_S, LatencySummary
from metrale_bench.records import BenchRecord, new_record
from metrale_bench.streaming import SamplingSpec
from metrale_bench.target import ServerTarget
from metrale_bench.types import MetricValue


@attrs.frozen(kw_only=True)
class TtftSpec:
    prefix_len: int = 512
    suffix_len: int = 32
    max_tokens: int = 4
    runs: int = 3
    seed: int = 0


def ttft_requests(
    spec: TtftSpec, *, tokens_per_word: float = 1.0
) -> tuple[list[BenchRequest], BenchRequest, list[BenchRequest]]:
    """Cold requests, the priming request, and warm requests sharing its prefix."""
    rng = random.Random(spec.seed)

    def segment(num_tokens: int) -> str:
        return random_text(words_for_tokens(num_tokens, tokens_per_word), rng) + " "

    def request(prompt: str) -> BenchRequest:
        return BenchRequest(prompt=prompt, max_tokens=spec.max_tokens)

    total = spec.prefix_len + spec.suffix_len
    cold = [request(segment(total)) for _ in range(spec.runs)]
    prefix = segment(spec.prefix_len)
    prime = request(prefix + segment(spec.suffix_len))
    warm = [request(prefix + segment(spec.suffix_len)) for _ in range(spec.runs)]
    return cold, prime, warm


def _summary_metrics(name: str, result: LoadResult) -> dict[str, MetricValue]:
    ttfts = [o.ttft_s for o in result.outcomes if o.is_success and o.ttft_s is not None]
    summary = LatencySummary.of_seconds(ttfts)
    return {
        f"ttft_{name}_p50_ms": None if summary is None else summary.median_ms,
        f"ttft_{name}_mean_ms": None if summary is None else summary.mean_ms,
        f"ttft_{name}_max_ms": None if not ttfts else max(ttfts) * MS_PER_S,
    }


async def run_ttft(
    target: ServerTarget,
    *,
    spec: TtftSpec,
    command: Sequence[str] = (),
    show_progress: bool = False,
) -> BenchRecord:
    identity = await identify(target)
    sampling = SamplingSpec(temperature=0.0, seed=spec.seed, ignore_eos=True)
    cold, prime, warm = ttft_requests(spec, tokens_per_word=identity.prompt_tokens_per_word)
    one_at_a_time = LoadSpec(max_concurrency=1)
    # A short unrelated request first, so the first cold run pays no first-call costs.
    await warm_up(target, identity.model, [BenchRequest(prompt="Hello", max_tokens=2)], sampling)
    results = {}
    for name, requests in (("cold", cold), ("warm", warm)):
        if name == "warm":
            await warm_up(target, identity.model, [prime], sampling)
        results[name] = await measured_load(
            target,
            identity.model,
            requests,
            load=one_at_a_time,
            sampling=sampling,
            label=f"ttft {name}",
            show_progress=show_progress,
        )
    metrics = {
        **_summary_metrics("cold", results["cold"]),
        **_summary_metrics("warm", results["warm"]),
    }
    cold_p50, warm_p50 = metrics["ttft_cold_p50_ms"], metrics["ttft_warm_p50_ms"]
    metrics["warm_over_cold"] = None if not cold_p50 or warm_p50 is None else warm_p50 / cold_p50
    samples = {
        f"ttft_{name}_ms": [
            round(o.ttft_s * MS_PER_S, 3)
            for o in result.outcomes
            if o.is_success and o.ttft_s is not None
        ]
        for name, result in results.items()
    }
    num_failed = sum(result.num_failed for result in results.values())
    return new_record(
        benchmark="ttft",
        command=command,
        base_url=target.base_url,
        model=identity.model,
        server_version=identity.version,
        params={
            **target_params(target),
            "spec": as_params(spec),
            "prompts": identity.prompt_params(),
        },
        metrics=metrics,
        samples=samples,
        num_failed=num_failed,
        errors=[e for result in results.values() for e in result.errors()][:5],
    )
