"""The concurrencies a concurrency-sweep record holds metrics for."""

from __future__ import annotations

import re

from metrale_bench.records import BenchRecord

_LEVEL = re.compile(r"^c(\d+)_(\w+_ms)$")


def sweep_levels(record: BenchRecord) -> list[int]:
    """The concurrencies a sweep record holds metrics for, ascending."""
    levels = {int(m.group(1)) for name in record.samples if (m := _LEVEL.match(name))}
    levels |= {
        int(name[1:].split("_", 1)[0])
        for name in record.metrics
        if name.startswith("c") and name.endswith("_output_tok_s")
    }
    return sorted(levels)
