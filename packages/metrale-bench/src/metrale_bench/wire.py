"""Wire types shared by the server and the harness: what the server's routes answer, as
frozen attrs values with ``to_json`` / ``from_json``.

``MemoryReport`` is ``GET /memory``. On the CPU and on a unified-memory device, device
allocations come out of host RAM, so the drop in host ``MemAvailable`` since the server started
is the serve's footprint; ``rss_anon_bytes`` is the process's own anonymous memory. A reading
the server could not take is ``None`` (JSON ``null``), never a substituted number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["MEMORY_REPORT_VERSION", "MemoryReport", "MemoryReportError"]

MEMORY_REPORT_VERSION = 1


class MemoryReportError(ValueError):
    """A ``/memory`` document that does not have ``MemoryReport``'s shape."""


@attrs.frozen(kw_only=True)
class MemoryReport:
    """The server's memory: the KV pool and slots it was built with, its budget, the plan's
    bytes by owner, the allocation ledger's live bytes by owner, and host readings.

    ``plan_by_owner`` is what the preflight computed from the config before any weight loaded;
    ``ledger_by_owner`` is what was actually allocated, by the same owner names.
    ``kv_cache_dtype``: how K/V attention layers store the pool (``auto``: the serve dtype;
    ``int8``, ``fp8_e4m3``, ``fp8_e5m2``: quantized), which ``kv_bytes_per_token`` prices.
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
    kv_cache_dtype: str = "auto"
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
    if name in ("device", "kv_cache_dtype"):
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
