"""Serving metrics as pure functions, with ``vllm bench serve``'s definitions.

Per request: TTFT, TPOT = (latency − TTFT) / (output tokens − 1) for requests with more than
one output token, ITL per streamed chunk, end-to-end latency. Over the run, with
``duration_s`` from the first dispatch to the last completion: request, output-token and
total-token throughput, and goodput (successful requests meeting every SLO, per second).
Only successful requests enter latencies, token totals and throughputs; failures are counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs

from metrale_bench.outcome import RequestOutcome
from metrale_bench.types import MetricValue

MS_PER_S = 1000.0


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def std(values: Sequence[float]) -> float:
    """Population standard deviation (numpy's default, as vLLM reports it)."""
    centre = mean(values)
    return math.sqrt(math.fsum((v - centre) ** 2 for v in values) / len(values))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks, like
    ``numpy.percentile``'s default."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    below = math.floor(rank)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (rank - below)


@attrs.frozen(kw_only=True)
class LatencySummary:
    """Mean, median, standard deviation, p90 and p99 of one latency, in milliseconds."""

    mean_ms: float
    median_ms: float
    std_ms: float
    p90_ms: float
    p99_ms: float

    @classmethod
    def of_seconds(cls, values_s: Sequence[float]) -> LatencySummary | None:
        """The summary of ``values_s`` (seconds), or ``None`` when there are none."""
        if not values_s:
            return None
        values_ms = [v * MS_PER_S for v in values_s]
        return cls(
            mean_ms=mean(values_ms),
            median_ms=percentile(values_ms, 50),
            std_ms=std(values_ms),
            p90_ms=percentile(values_ms, 90),
            p99_ms=percentile(values_ms, 99),
        )


def tpot_s(outcome: RequestOutcome) -> float | None:
    """Time per output token after the first, or ``None`` with one output token or fewer."""
    if outcome.ttft_s is None or outcome.output_tokens <= 1:
        return None
    return (outcome.latency_s - outcome.ttft_s) / (outcome.output_tokens - 1)


@attrs.frozen(kw_only=True)
class Slo:
    """Service-level objectives in milliseconds; ``None`` places no bound."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))

    @classmethod
    def parse(cls, text: str) -> Slo:
        """``"ttft:500,tpot:50,e2e:4000"`` (``=`` works as well as ``:``); any subset."""
        bounds: dict[str, float] = {}
        for item in text.replace(" ", ",").split(","):
            if not item:
                continue
            name, sep, value = item.replace("=", ":").partition(":")
            key = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms", "e2el": "e2e_ms"}.get(
                name.strip().lower()
            )
            if key is None or not sep:
                raise ValueError(f"SLO {item!r}: expected ttft:MS, tpot:MS or e2e:MS")
            try:
                bound = float(value)
            except ValueError:
                raise ValueError(f"SLO {item!r}: {value!r} is not a number") from None
            if not bound > 0:
                raise ValueError(f"SLO {item!r}: the bound must be positive")
            bounds[key] = bound
        return cls(**bounds)


def meets_slo(outcome: RequestOutcome, slo: Slo) -> bool:
    """Whether a successful request meets every bound; TPOT counts as 0 with one output token
    (vLLM's goodput rule)."""
    if not outcome.is_success or outcome.ttft_s is None:
        return False
    checks = (
        (slo.ttft_ms, outcome.ttft_s),
        (slo.tpot_ms, tpot_s(outcome) or 0.0),
        (slo.e2e_ms, outcome.latency_s),
    )
    return all(bound is None or value * MS_PER_S <= bound for bound, value in checks)


def max_concurrent_requests(outcomes: Iterable[RequestOutcome]) -> int:
    """The most requests in flight at once, each over ``[start_s, end_s)``."""
    events = []
    for outcome in outcomes:
        events.append((outcome.start_s, 1))
        events.append((outcome.end_s, -1))
    # At equal times the end sorts first: a request ending as another starts does not overlap.
    events.sort()
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


@attrs.frozen(kw_only=True)
class ServeMetrics:
    """The aggregate of one run's outcomes (see the module docstring for definitions)."""

    num_requests: int
    num_completed: int
    num_failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    request_goodput: float | None
    mean_concurrency: float
    max_concurrent_requests: int
    ttft: LatencySummary | None
    tpot: LatencySummary | None
    itl: LatencySummary | None
    e2e: LatencySummary | None

    def flat(self, prefix: str = "") -> dict[str, MetricValue]:
        """One flat name → value map (``ttft_p99_ms``, ``output_tok_s``, …) for records."""
        out: dict[str, MetricValue] = {
            "num_requests": self.num_requests,
            "num_completed": self.num_completed,
            "num_failed": self.num_failed,
            "duration_s": self.duration_s,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "mean_input_tokens": (
                self.total_input_tokens / self.num_completed if self.num_completed else None
            ),
            "request_s": self.request_throughput,
            "output_tok_s": self.output_throughput,
            "total_tok_s": self.total_token_throughput,
            "goodput_request_s": self.request_goodput,
            "mean_concurrency": self.mean_concurrency,
            "max_concurrent_requests": self.max_concurrent_requests,
        }
        for name in ("ttft", "tpot", "itl", "e2e"):
            summary: LatencySummary | None = getattr(self, name)
            for stat in ("mean", "median", "std", "p90", "p99"):
                key = "p50" if stat == "median" else stat
                out[f"{name}_{key}_ms"] = (
                    None if summary is None else getattr(summary, f"{stat}_ms")
                )
        return {f"{prefix}{key}": value for key, value in out.items()}


def compute_serve_metrics(
    outcomes: Sequence[RequestOutcome], duration_s: float, slo: Slo | None = None
) -> ServeMetrics:
    """Aggregate ``outcomes`` over a run of ``duration_s`` seconds; goodput only with an SLO."""
    if duration_s <= 0:
        raise ValueError(f"a run lasts a positive time, got {duration_s}")
    completed = [o for o in outcomes if o.is_success]
    input_tokens = sum(o.prompt_tokens for o in completed)
    output_tokens = sum(o.output_tokens for o in completed)
    tpots = [t for t in (tpot_s(o) for o in completed) if t is not None]
    goodput = None
    if slo is not None and slo.is_set:
        goodput = sum(meets_slo(o, slo) for o in completed) / duration_s
    return ServeMetrics(
        num_requests=len(outcomes),
        num_completed=len(completed),
        num_failed=len(outcomes) - len(completed),
        duration_s=duration_s,
        total_input_tokens=input_tokens,
        total_output_tokens=output_tokens,
        request_throughput=len(completed) / duration_s,
        output_throughput=output_tokens / duration_s,
        total_token_throughput=(input_tokens + output_tokens) / duration_s,
        request_goodput=goodput,
        mean_concurrency=math.fsum(o.latency_s for o in completed) / duration_s,
        max_concurrent_requests=max_concurrent_requests(outcomes),
        ttft=LatencySummary.of_seconds([o.ttft_s for o in completed if o.ttft_s is not None]),
        tpot=LatencySummary.of_seconds(tpots),
        itl=LatencySummary.of_seconds([gap for o in completed for gap in o.itl_s]),
        e2e=LatencySummary.of_seconds([o.latency_s for o in completed]),
    )


def latency_samples_ms(outcomes: Iterable[RequestOutcome]) -> dict[str, list[float]]:
    """Per-request TTFT, TPOT and end-to-end latency of the successful requests, in ms
    (rounded to microseconds), for CDF plots."""
    samples: dict[str, list[float]] = {"ttft_ms": [], "tpot_ms": [], "e2e_ms": []}
    for outcome in outcomes:
        if not outcome.is_success or outcome.ttft_s is None:
            continue
        samples["ttft_ms"].append(round(outcome.ttft_s * MS_PER_S, 3))
        samples["e2e_ms"].append(round(outcome.latency_s * MS_PER_S, 3))
        tpot = tpot_s(outcome)
        if tpot is not None:
            samples["tpot_ms"].append(round(tpot * MS_PER_S, 3))
    return samples
