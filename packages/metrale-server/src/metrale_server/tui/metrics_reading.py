"""``MetricsReading``: the numbers a dashboard needs from one ``/metrics`` scrape."""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs
from prometheus_client.parser import text_string_to_metric_families

from metrale_server.tui.histogram import BucketCounts

TTFT_NAME = "metrale_time_to_first_token_seconds"
TPOT_NAME = "metrale_time_per_output_token_seconds"


@attrs.frozen(kw_only=True)
class MetricsReading:
    """Gauges and totals since the server started (metrics it does not export read as 0)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_prefix_queried_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    num_preemptions: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_finished_by_reason: Mapping[str, int] = attrs.field(factory=dict)
    ttft: BucketCounts = attrs.field(factory=BucketCounts)
    tpot: BucketCounts = attrs.field(factory=BucketCounts)

    @property
    def num_finished(self) -> int:
        return sum(self.num_finished_by_reason.values())

    @property
    def prefix_hit_rate(self) -> float | None:
        if self.num_prefix_queried_tokens <= 0:
            return None
        return self.num_prefix_hit_tokens / self.num_prefix_queried_tokens

    @property
    def draft_acceptance_rate(self) -> float | None:
        """Speculative tokens kept / proposed; ``None`` when none were proposed."""
        if self.num_draft_tokens <= 0:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    @classmethod
    def from_prometheus_text(cls, text: str) -> MetricsReading:
        """Parse the text exposition; raises ``ValueError`` if it is not one."""
        values: dict[str, float] = {}
        finished: dict[str, int] = {}
        buckets: dict[str, list[tuple[float, float]]] = {TTFT_NAME: [], TPOT_NAME: []}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "metrale_request_success_total":
                    reason = sample.labels.get("finished_reason", "unknown")
                    finished[reason] = finished.get(reason, 0) + int(sample.value)
                elif sample.name.endswith("_bucket") and family.name in buckets:
                    le = sample.labels["le"]
                    bound = math.inf if le == "+Inf" else float(le)
                    buckets[family.name].append((bound, sample.value))
                else:
                    values[sample.name] = values.get(sample.name, 0.0) + sample.value

        def count(name: str) -> int:
            return int(values.get(name, 0.0))

        return cls(
            num_running=count("metrale_num_requests_running"),
            num_waiting=count("metrale_num_requests_waiting"),
            kv_usage=values.get("metrale_kv_cache_usage_perc", 0.0),
            num_prompt_tokens=count("metrale_prompt_tokens_total"),
            num_generation_tokens=count("metrale_generation_tokens_total"),
            num_prefix_queried_tokens=count("metrale_prefix_cache_queries_total"),
            num_prefix_hit_tokens=count("metrale_prefix_cache_hits_total"),
            num_preemptions=count("metrale_num_preemptions_total"),
            num_draft_tokens=count("metrale_spec_decode_num_draft_tokens_total"),
            num_accepted_tokens=count("metrale_spec_decode_num_accepted_tokens_total"),
            num_finished_by_reason=finished,
            ttft=_bucket_counts(buckets[TTFT_NAME]),
            tpot=_bucket_counts(buckets[TPOT_NAME]),
        )


def _bucket_counts(pairs: list[tuple[float, float]]) -> BucketCounts:
    pairs.sort()
    return BucketCounts(
        upper_bounds=tuple(b for b, _ in pairs), cumulative_counts=tuple(c for _, c in pairs)
    )
