"""``run_load``: send a list of requests at their arrival times, at most N in flight."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import attrs

from metrale_bench.arrivals import arrival_offsets_s
from metrale_bench.datasets import BenchRequest
from metrale_bench.outcome import RequestOutcome
from metrale_bench.streaming import SamplingSpec, request_body, stream_request
from metrale_bench.target import ServerTarget

OnOutcome = Callable[[RequestOutcome], None]


@attrs.frozen(kw_only=True)
class LoadSpec:
    """How requests arrive: ``request_rate`` per second (``None``: all at once) with gamma
    ``burstiness``, and at most ``max_concurrency`` in flight (``None``: no cap)."""

    request_rate: float | None = None
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")


@attrs.frozen(kw_only=True)
class LoadResult:
    """Every request's outcome, in request order, and the run's duration (first dispatch to
    last completion)."""

    outcomes: tuple[RequestOutcome, ...]
    duration_s: float

    @property
    def num_failed(self) -> int:
        return sum(not o.is_success for o in self.outcomes)

    def errors(self, limit: int = 5) -> list[str]:
        """The first ``limit`` distinct failure messages."""
        seen: list[str] = []
        for outcome in self.outcomes:
            if outcome.error is not None and outcome.error not in seen:
                seen.append(outcome.error)
        return seen[:limit]


async def run_load(
    target: ServerTarget,
    model: str,
    requests: Sequence[BenchRequest],
    *,
    load: LoadSpec,
    sampling: SamplingSpec,
    on_outcome: OnOutcome | None = None,
) -> LoadResult:
    """Stream every request to ``target`` and collect the outcomes; a failed request is an
    outcome with an error, never an exception. ``on_outcome`` sees each as it completes."""
    bodies = [request_body(target.api, model, request, sampling) for request in requests]
    offsets = arrival_offsets_s(
        len(bodies), load.request_rate, burstiness=load.burstiness, seed=load.seed
    )
    slots = asyncio.Semaphore(load.max_concurrency or max(1, len(bodies)))
    async with target.client(max_connections=load.max_concurrency) as client:
        run_start = time.perf_counter()

        async def one(body: dict[str, object], offset_s: float) -> RequestOutcome:
            delay = run_start + offset_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with slots:
                outcome = await stream_request(
                    client, target.endpoint_path, body, run_start=run_start
                )
            if on_outcome is not None:
                on_outcome(outcome)
            return outcome

        outcomes = await asyncio.gather(
            *(one(body, offset) for body, offset in zip(bodies, offsets, strict=True))
        )
        duration_s = time.perf_counter() - run_start
    return LoadResult(outcomes=tuple(outcomes), duration_s=duration_s)
