"""Prometheus metrics named after vLLM's (``metrale_*``), one registry per app.

Gauges and engine-wide counters are read from the engine at scrape time; latency histograms,
finished-request counts and prompt tokens are recorded by the API from each request's outputs.
As vLLM's ``prompt_tokens`` and ``prompt_tokens_cached``, ``metrale_prompt_tokens_total``
counts every prompt token of a request once, when its first output token arrives, and
``metrale_prompt_tokens_cached_total`` those of them its prefix-cache hit supplied (the
tokens prefill computed are the difference; a preempted request's recompute is not counted).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from metrale_server.api.recent_requests import (
    ABORT_FINISH_REASON,
    FinishedRequest,
    RecentRequests,
)
from metrale_server.engine.client import EngineClient
from metrale_server.output.outputs import RequestOutput

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                  7.5, 10.0, 20.0, 40.0, 80.0, 160.0)  # fmt: skip
TPOT_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                  1.0, 2.5, 5.0, 7.5, 10.0)  # fmt: skip
E2E_BUCKETS_S = (0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                 50.0, 60.0, 120.0, 240.0, 480.0)  # fmt: skip


class _EngineCollector(Collector):
    """What the engine knows, read when ``/metrics`` is scraped: the engine's published stats
    snapshot (one reference read, any thread) and its fixed sizes."""

    def __init__(self, engine: EngineClient, model_name: str) -> None:
        self._engine = engine
        self._labels = [model_name]

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        stats = engine.stats
        yield self._gauge(
            "metrale_num_requests_running",
            "Requests in the running batch.",
            stats.num_running_requests,
        )
        yield self._gauge(
            "metrale_num_requests_waiting",
            "Requests waiting to be scheduled.",
            stats.num_waiting_requests,
        )
        yield self._gauge(
            "metrale_kv_cache_usage_perc",
            "Fraction of KV cache blocks in use (0..1).",
            stats.kv_cache_usage,
        )
        yield self._gauge(
            "metrale_kv_cache_blocks_total",
            "KV cache blocks in the pool.",
            engine.info.num_kv_blocks,
        )
        yield self._gauge(
            "metrale_kv_cache_block_bytes",
            "Bytes of one KV cache block over all layers.",
            engine.info.kv_block_bytes,
        )
        yield self._gauge(
            "metrale_memory_budget_bytes",
            "Total device memory x --gpu-memory-utilization.",
            engine.info.budget_bytes,
        )
        ledger = GaugeMetricFamily(
            "metrale_memory_ledger_bytes",
            "Live bytes in the allocation ledger, by owner.",
            labels=["model_name", "owner"],
        )
        for owner, size in sorted(engine.live_bytes_by_owner().items()):
            ledger.add_metric([*self._labels, owner], size)
        yield ledger
        yield self._counter(
            "metrale_generation_tokens", "Tokens generated.", stats.num_generated_tokens
        )
        yield self._counter(
            "metrale_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            stats.prefix_cache_queries,
        )
        yield self._counter(
            "metrale_prefix_cache_hits",
            "Prompt tokens found in the prefix cache.",
            stats.prefix_cache_hits,
        )
        yield self._counter(
            "metrale_spec_decode_num_draft_tokens",
            "Speculative tokens proposed (n-gram drafts).",
            stats.num_draft_tokens,
        )
        yield self._counter(
            "metrale_spec_decode_num_accepted_tokens",
            "Speculative tokens the target model kept.",
            stats.num_accepted_tokens,
        )
        by_position = CounterMetricFamily(
            "metrale_spec_decode_num_accepted_tokens_per_pos",
            "Speculative tokens kept, by draft position (0: right after the last token).",
            labels=["model_name", "position"],
        )
        for position, count in enumerate(stats.num_accepted_by_position):
            by_position.add_metric([*self._labels, str(position)], count)
        yield by_position
        yield self._counter(
            "metrale_mm_images_encoded",
            "Images run through the vision tower.",
            stats.num_images_encoded,
        )
        yield self._counter(
            "metrale_mm_image_cache_hits",
            "Images whose encoder output the cache held (not encoded again).",
            stats.num_image_cache_hits,
        )
        yield self._counter(
            "metrale_num_preemptions",
            "Sequences preempted for lack of KV blocks.",
            stats.num_preemptions,
        )

    def _gauge(self, name: str, documentation: str, value: float) -> Metric:
        family = GaugeMetricFamily(name, documentation, labels=["model_name"])
        family.add_metric(self._labels, value)
        return family

    def _counter(self, name: str, documentation: str, value: float) -> Metric:
        family = CounterMetricFamily(name, documentation, labels=["model_name"])
        family.add_metric(self._labels, value)
        return family


class ServerMetrics:
    """The ``/metrics`` registry of one app: engine readings plus per-request latencies."""

    def __init__(self, engine: EngineClient, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, model_name))
        self.recent_requests = RecentRequests()
        self._model_name = model_name
        labels = ["model_name"]
        self.time_to_first_token = Histogram(
            "metrale_time_to_first_token_seconds",
            "Time from the request's arrival to its first generated token.",
            labels,
            buckets=TTFT_BUCKETS_S,
            registry=self.registry,
        ).labels(model_name)
        self.time_per_output_token = Histogram(
            "metrale_time_per_output_token_seconds",
            "Mean time between output tokens after the first, per request.",
            labels,
            buckets=TPOT_BUCKETS_S,
            registry=self.registry,
        ).labels(model_name)
        self.e2e_request_latency = Histogram(
            "metrale_e2e_request_latency_seconds",
            "Time from the request's arrival to its end.",
            labels,
            buckets=E2E_BUCKETS_S,
            registry=self.registry,
        ).labels(model_name)
        self.prompt_tokens = Counter(
            "metrale_prompt_tokens",
            "Prompt tokens of the requests that began generating, cached or computed.",
            labels,
            registry=self.registry,
        ).labels(model_name)
        self.prompt_tokens_cached = Counter(
            "metrale_prompt_tokens_cached",
            "Prompt tokens of those requests that the prefix cache supplied.",
            labels,
            registry=self.registry,
        ).labels(model_name)
        self._request_success = Counter(
            "metrale_request_success",
            "Finished outputs by finish reason.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    def track(self) -> RequestTracker:
        """A tracker for one request arriving now."""
        return RequestTracker(self)

    def count_finished(self, finish_reason: str) -> None:
        self._request_success.labels(self._model_name, finish_reason).inc()


class RequestTracker:
    """Feeds one request's outputs to the histograms; records once, when it finishes or is
    abandoned before its last output."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics
        self._arrival = time.monotonic()
        self._first_token_at: float | None = None
        self._num_completion_tokens = 0
        self._is_recorded = False

    def abandoned(self, request_id: str, num_prompt_tokens: int) -> None:
        """The request ends without its last output (its client left, or it was aborted): it
        is recorded once, finish reason ``abort``, with the tokens made until then."""
        if self._is_recorded:
            return
        self._is_recorded = True
        self._metrics.recent_requests.add(
            FinishedRequest(
                request_id=request_id,
                num_prompt_tokens=num_prompt_tokens,
                num_completion_tokens=self._num_completion_tokens,
                latency_s=time.monotonic() - self._arrival,
                finish_reason=ABORT_FINISH_REASON,
                finished_at=time.time(),
            )
        )
        self._metrics.count_finished(ABORT_FINISH_REASON)

    def observe(self, output: RequestOutput) -> None:
        now = time.monotonic()
        self._num_completion_tokens = sum(o.num_tokens for o in output.outputs)
        if self._first_token_at is None and any(o.delta_token_ids for o in output.outputs):
            self._first_token_at = now
            self._metrics.time_to_first_token.observe(now - self._arrival)
            self._metrics.prompt_tokens.inc(len(output.prompt_token_ids))
            self._metrics.prompt_tokens_cached.inc(output.num_cached_tokens)
        if output.finished and not self._is_recorded:
            self._is_recorded = True
            self._metrics.recent_requests.add(
                FinishedRequest.from_output(output, now - self._arrival)
            )
        if not output.finished or output.error is not None:
            return
        self._metrics.e2e_request_latency.observe(now - self._arrival)
        num_tokens = max((o.num_tokens for o in output.outputs), default=0)
        if self._first_token_at is not None and num_tokens > 1:
            self._metrics.time_per_output_token.observe(
                (now - self._first_token_at) / (num_tokens - 1)
            )
        for completion in output.outputs:
            if completion.finish_reason is not None:
                self._metrics.count_finished(completion.finish_reason)
