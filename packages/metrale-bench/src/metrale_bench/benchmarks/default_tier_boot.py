"""The default-tier boot benchmark (``run_default_tier_boot``): warm a server with 8
concurrent chats, then record ``GET /memory`` (:class:`~metrale_bench.wire.MemoryReport`):
its footprint against budget. ``met bench default-tier-boot`` boots ``met serve`` for it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from metrale_bench.benchmarks.common import as_params, identify, measured_load
from metrale_bench.benchmarks.serve import load_metrics
from metrale_bench.datasets import BenchRequest, random_text
from metrale_bench.load import LoadSpec
from metrale_bench.records import BenchRecord, new_record
from metrale_bench.streaming import SamplingSpec
from metrale_bench.target import ServerTarget, TargetError, get_json
from metrale_bench.types import MetricValue
from metrale_bench.wire import MemoryReport, MemoryReportError

MIB = 1 << 20
MEMORY_METRIC_NAMES = (
    "kv_blocks",
    "max_kv_tokens",
    "max_batch_size",
    "budget_mib",
    "device_footprint_mib",
    "footprint_over_budget_mib",
    "ledger_live_mib",
    "rss_anon_mib",
)


@attrs.frozen(kw_only=True)
class TierBootSpec:
    """The warm-up: ``num_chats`` concurrent chats of about ``prompt_words`` prompt tokens and
    ``max_tokens`` output tokens, at ``temperature`` with ``seed``."""

    num_chats: int = 8
    prompt_words: int = 128
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0


def _mib(num_bytes: int | None) -> float | None:
    return None if num_bytes is None else num_bytes / MIB


def memory_metrics(report: MemoryReport | None) -> dict[str, MetricValue]:
    """The record's memory metrics (all ``None`` without a report). The device footprint is
    the drop in host ``MemAvailable`` since the server started, ``None`` when the server could
    not read it."""
    if report is None:
        return dict.fromkeys(MEMORY_METRIC_NAMES)
    footprint = _mib(report.mem_available_drop_bytes)
    budget = report.budget_bytes / MIB
    return {
        "kv_blocks": report.kv_blocks,
        "max_kv_tokens": report.max_kv_tokens,
        "max_batch_size": report.max_batch_size,
        "budget_mib": budget,
        "device_footprint_mib": footprint,
        "footprint_over_budget_mib": None if footprint is None else footprint - budget,
        "ledger_live_mib": _mib(report.ledger_live_bytes),
        "rss_anon_mib": _mib(report.rss_anon_bytes),
    }


def tier_boot_requests(spec: TierBootSpec) -> list[BenchRequest]:
    """The warm-up chats (distinct prompts; same seed, same prompts)."""
    rng = random.Random(spec.seed)
    return [
        BenchRequest(prompt=random_text(spec.prompt_words, rng), max_tokens=spec.max_tokens)
        for _ in range(spec.num_chats)
    ]


async def run_default_tier_boot(
    target: ServerTarget,
    *,
    spec: TierBootSpec,
    command: Sequence[str] = (),
    boot: Mapping[str, Any] | None = None,
    show_progress: bool = False,
) -> BenchRecord:
    """Warm ``target`` (its endpoint forced to chat) with the spec's chats, then read
    ``GET /memory`` into the record: memory metrics, the chats' serve metrics prefixed
    ``chat_``, the report under ``details["memory"]`` and ``details["verdict"]``: ``info``, or
    ``inconclusive`` when there is no report or no footprint reading. An unreadable
    ``/memory`` counts as a failure. ``boot`` describes how the server was started, when this
    run started it."""
    target = attrs.evolve(target, api="chat")
    identity = await identify(target)
    result = await measured_load(
        target,
        identity.model,
        tier_boot_requests(spec),
        load=LoadSpec(max_concurrency=spec.num_chats),
        sampling=SamplingSpec(temperature=spec.temperature, seed=spec.seed),
        label="default-tier chats",
        show_progress=show_progress,
    )
    chat_metrics, samples = load_metrics(result, None, prefix="chat_")
    errors = result.errors()
    report: MemoryReport | None = None
    async with target.client() as client:
        try:
            report = MemoryReport.from_json(await get_json(client, "/memory"))
        except (TargetError, MemoryReportError) as error:
            errors.append(f"/memory: {error}")
    metrics = memory_metrics(report)
    is_conclusive = metrics["device_footprint_mib"] is not None
    details: dict[str, Any] = {
        "verdict": "info" if is_conclusive else "inconclusive",
        "memory": None if report is None else report.to_json(),
    }
    if boot is not None:
        details["boot"] = dict(boot)
    return new_record(
        benchmark="default-tier-boot",
        command=command,
        base_url=target.base_url,
        model=identity.model,
        server_version=identity.version,
        params={"api": target.api, "spec": as_params(spec)},
        metrics={**metrics, **chat_metrics},
        samples=samples,
        num_failed=result.num_failed + (report is None),
        errors=errors,
        details=details,
    )
