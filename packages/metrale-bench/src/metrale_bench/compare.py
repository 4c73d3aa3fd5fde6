"""Compare two records metric by metric: ``B / A`` for every metric either one has."""

from __future__ import annotations

import attrs
from rich.table import Table

from metrale_bench.records import BenchRecord
from metrale_bench.types import MetricValue


@attrs.frozen(kw_only=True)
class MetricComparison:
    """One metric in both records; ``ratio`` is ``b / a``, ``None`` when either is missing or
    ``a`` is 0."""

    name: str
    a: MetricValue
    b: MetricValue

    @property
    def ratio(self) -> float | None:
        if self.a is None or self.b is None or self.a == 0:
            return None
        return self.b / self.a


def compare_records(a: BenchRecord, b: BenchRecord) -> list[MetricComparison]:
    """Metrics in ``a``'s order, then those only ``b`` has."""
    names = [*a.metrics, *(name for name in b.metrics if name not in a.metrics)]
    return [
        MetricComparison(name=name, a=a.metrics.get(name), b=b.metrics.get(name)) for name in names
    ]


def comparison_table(rows: list[MetricComparison], *, a_label: str, b_label: str) -> Table:
    table = Table(title=f"B / A  (A = {a_label}, B = {b_label})")
    table.add_column("metric")
    table.add_column("A", justify="right")
    table.add_column("B", justify="right")
    table.add_column("B / A", justify="right")
    for row in rows:
        ratio = "—" if row.ratio is None else f"{row.ratio:.3f}"
        table.add_row(row.name, format_value(row.a), format_value(row.b), ratio)
    return table


def format_value(value: MetricValue) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:.1f}"
