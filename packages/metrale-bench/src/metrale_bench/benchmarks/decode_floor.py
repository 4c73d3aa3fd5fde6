"""The ``decode-floor`` driver: one stream's decode speed, the floor every batch builds on.

``runs`` requests go one at a time, each ``output_len`` tokens with ``ignore_eos``. A run's
decode speed is (output tokens − 1) / (latency − TTFT), i.e. 1 / TPOT; the record holds the
median over runs (``decode_tok_s``), the best run, the median TPOT and TTFT.
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
from metrale_bench.datasets import random_requests
from metrale_bench.load import LoadSpec
from metrale_bench.metrics import MS_PER_S, latency_samples_ms, percentile, tpot_s
from metrale_bench.records import BenchRecord, new_record
from metrale_bench.streaming import SamplingSpec
from metrale_bench.target import ServerTarget
from metrale_bench.types import MetricValue


@attrs.frozen(kw_only=True)
class DecodeFloorSpec:
    input_len: int = 128
    output_len: int = 256
    runs: int = 3
    num_warmups: int = 1
    seed: int = 0


async def run_decode_floor(
    target: ServerTarget,
    *,
    spec: DecodeFloorSpec,
    command: Sequence[str] = (),
    show_progress: bool = False,
) -> BenchRecord:
    identity = await identify(target)
    sampling = SamplingSpec(temperature=0.0, seed=spec.seed, ignore_eos=True)
    requests = random_requests(
        num_requests=spec.runs + spec.num_warmups,
        input_len=spec.input_len,
        output_len=spec.output_len,
        seed=spec.seed,
        tokens_per_word=identity.prompt_tokens_per_word,
    )
    await warm_up(target, identity.model, requests[: spec.num_warmups], sampling)
    result = await measured_load(
        target,
        identity.model,
        requests[spec.num_warmups :],
        load=LoadSpec(max_concurrency=1),
        sampling=sampling,
        label="decode floor",
        show_progress=show_progress,
    )
    tpots = [t for t in (tpot_s(o) for o in result.outcomes if o.is_success) if t is not None]
    ttfts = [o.ttft_s for o in result.outcomes if o.is_success and o.ttft_s is not None]
    completed = [o for o in result.outcomes if o.is_success]
    metrics: dict[str, MetricValue] = {
        "decode_tok_s": 1.0 / percentile(tpots, 50) if tpots else None,
        "decode_tok_s_best": 1.0 / min(tpots) if tpots else None,
        "client_tpot_p50_ms": percentile(tpots, 50) * MS_PER_S if tpots else None,
        "ttft_p50_ms": percentile(ttfts, 50) * MS_PER_S if ttfts else None,
        "min_output_tokens": min((o.output_tokens for o in completed), default=None),
        "runs": len(completed),
        "num_failed": result.num_failed,
    }
    return new_record(
        benchmark="decode-floor",
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
        samples=latency_samples_ms(result.outcomes),
        num_failed=result.num_failed,
        errors=result.errors(),
    )
