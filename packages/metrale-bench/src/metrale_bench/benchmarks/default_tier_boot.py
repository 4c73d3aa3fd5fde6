"""The default-tier boot benchmark: its wire type, what ``GET /memory`` reports
(``MemoryReport``), and its driver (``run_default_tier_boot``: warm a server with 8 concurrent
chats, then record ``/memory``'s footprint against budget; ``met bench default-tier-boot``
boots ``met serve`` for it).

On the CPU and on a unified-memory device, device allocations come out of host RAM, so the drop
in host ``MemAvailable`` since the server started is the serve's footprint; ``rss_anon_bytes``
is the process's own anonymous memory. A reading the server could
not take is ``None`` (JSON ``null``), never a substituted number.
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

MEMORY_REPORT_VERSION = 1


class MemoryReportError(ValueError):
    """A ``/memory`` document that does not have ``MemoryReport``'s shape."""


@attrs.frozen(kw_only=True)
class MemoryReport:
    """The server's memory: the KV pool and slots it was built with, its budget, the plan's
    bytes by owner, the allocation ledger's live bytes by owner, and host readings.

    ``plan_by_owner`` is what the preflight computed from the config before any weight loaded;
    ``ledger_by_owner`` is what was actually allocated, by the same owner names.
    """

    kv_blocks: int
    kv_block_bytes: int
    max_batch_size: int
    budget_bytes: int
    ledger_live_bytes: int | None
    mem_available_at_start_bytes: int | None
    mem_available_now_bytes: int | None
    rss_anon_bytes: int | None
    device: str
    total_bytes: int
    gpu_memory_utilization: float
    block_size: int
    max_seq_len: int
    kv_bytes_per_token: int
    plan_by_owner: Mapping[str, int] = attrs.field(factory=dict)
    ledger_by_owner: Mapping[str, int] = attrs.field(factory=dict)
    version: int = MEMORY_REPORT_VERSION

    @property
    def max_kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size

    @property
    def mem_available_drop_bytes(self) -> int | None:
        """How much host ``MemAvailable`` fell since the server started, when both readings
        exist."""
        if self.mem_available_at_start_bytes is None or self.mem_available_now_bytes is None:
            return None
        return self.mem_available_at_start_bytes - self.mem_available_now_bytes

    def to_json(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["plan_by_owner"] = dict(self.plan_by_owner)
        out["ledger_by_owner"] = dict(self.ledger_by_owner)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryReport:
        """Parse a ``/memory`` document; raises :class:`MemoryReportError` naming the field."""
        if not isinstance(data, Mapping):
            raise MemoryReportError(f"a /memory document is a JSON object, got {type(data)}")
        values: dict[str, Any] = {}
        for field in attrs.fields(cls):
            if field.name not in data:
                if field.default is attrs.NOTHING:
                    raise MemoryReportError(f"/memory: field {field.name!r} is missing")
                continue
            values[field.name] = _checked(field.name, data[field.name])
        return cls(**values)


_NULLABLE = {
    "ledger_live_bytes",
    "mem_available_at_start_bytes",
    "mem_available_now_bytes",
    "rss_anon_bytes",
}


def _checked(name: str, value: Any) -> Any:
    if value is None and name in _NULLABLE:
        return None
    if name in ("plan_by_owner", "ledger_by_owner"):
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and _is_int(v) for k, v in value.items()
        ):
            raise MemoryReportError(f"/memory: {name!r} must map owner names to integers")
        return dict(value)
    if name == "device":
        if not isinstance(value, str):
            raise MemoryReportError(f"/memory: {name!r} must be a string, got {value!r}")
        return value
    if name == "gpu_memory_utilization":
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise MemoryReportError(f"/memory: {name!r} must be a number, got {value!r}")
        return float(value)
    if not _is_int(value):
        raise MemoryReportError(f"/memory: {name!r} must be an integer, got {value!r}")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The driver: warm a server with concurrent chats, then read /memory.

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
