from __future__ import annotations

import attrs
import pytest
from rich.console import Console

from metrale_bench.compare import compare_records, comparison_table, format_value
from metrale_bench.records import new_record


def test_ratios_are_b_over_a() -> None:
    a = new_record(
        benchmark="serve",
        command=[],
        base_url="u",
        model=None,
        server_version=None,
        params={},
        metrics={"tok_s": 10.0, "ttft_ms": 0.0, "gone": 3, "none": None},
    )
    b = attrs.evolve(a, metrics={"tok_s": 15.0, "ttft_ms": 4.0, "none": 2, "new": 1})
    rows = {row.name: row for row in compare_records(a, b)}
    assert [row.name for row in compare_records(a, b)] == [
        "tok_s",
        "ttft_ms",
        "gone",
        "none",
        "new",
    ]
    assert rows["tok_s"].ratio == pytest.approx(1.5)
    assert rows["ttft_ms"].ratio is None  # A is 0
    assert rows["gone"].b is None
    assert rows["gone"].ratio is None
    assert rows["none"].ratio is None
    assert rows["new"].a is None


def test_table_renders_every_row() -> None:
    a = new_record(benchmark="serve", command=[], base_url="u", model=None, server_version=None,
                   params={}, metrics={"tok_s": 10.0})  # fmt: skip
    b = attrs.evolve(a, metrics={"tok_s": 25.0})
    console = Console(width=120, record=True)
    console.print(comparison_table(compare_records(a, b), a_label="a.json", b_label="b.json"))
    text = console.export_text()
    assert "tok_s" in text
    assert "2.500" in text
    assert "a.json" in text


def test_format_value() -> None:
    assert format_value(None) == "—"
    assert format_value(7) == "7"
    assert format_value(12.34567) == "12.35"
    assert format_value(12345.678) == "12345.7"
