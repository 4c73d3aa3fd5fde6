from __future__ import annotations

from typing import Any

import pytest

import metrale_bench
from metrale_bench.wire import MemoryReport, MemoryReportError

from .conftest import FAKE_MEMORY


def test_memory_report_round_trips_through_json() -> None:
    report = MemoryReport.from_json(FAKE_MEMORY)
    # (A document from before kv_cache_dtype existed is a pool at the model dtype.)
    assert report.to_json() == {**FAKE_MEMORY, "kv_cache_dtype": "auto", "version": 1}
    assert MemoryReport.from_json(report.to_json()) == report
    assert report.max_kv_tokens == 64 * 16
    assert report.mem_available_drop_bytes == 600 << 20
    assert metrale_bench.MemoryReport is MemoryReport


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kv_blocks": None}, "'kv_blocks' must be an integer"),
        ({"device": 3}, "'device' must be a string"),
        ({"kv_cache_dtype": 8}, "'kv_cache_dtype' must be a string"),
        ({"gpu_memory_utilization": True}, "'gpu_memory_utilization' must be a number"),
        ({"plan_by_owner": {"kv": 1.5}}, "'plan_by_owner' must map owner names to integers"),
    ],
)
def test_a_bad_field_is_named(change: dict[str, Any], message: str) -> None:
    with pytest.raises(MemoryReportError, match=message):
        MemoryReport.from_json({**FAKE_MEMORY, **change})


def test_a_missing_field_is_named_and_nulls_stay_null() -> None:
    without = {k: v for k, v in FAKE_MEMORY.items() if k != "budget_bytes"}
    with pytest.raises(MemoryReportError, match="'budget_bytes' is missing"):
        MemoryReport.from_json(without)
    unread = MemoryReport.from_json({**FAKE_MEMORY, "rss_anon_bytes": None})
    assert unread.rss_anon_bytes is None
