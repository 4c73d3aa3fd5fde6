from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from metrale_bench.records import (
    SCHEMA_VERSION,
    BenchRecord,
    GitState,
    RecordError,
    find_records,
    new_record,
    read_record,
    write_record,
)


def _record(**changes: object) -> BenchRecord:
    record = new_record(
        benchmark="serve",
        command=["met", "bench", "serve"],
        base_url="http://127.0.0.1:1",
        model="m",
        server_version={"version": "1.2.3"},
        params={"load": {"request_rate": float("inf"), "max_concurrency": 4}},
        metrics={"output_tok_s": 12.5, "ttft_p50_ms": None, "num_failed": 0},
        samples={"ttft_ms": [1.0, 2.5]},
        details={"note": "x"},
    )
    return attrs.evolve(record, **changes)


def test_round_trip_through_json(tmp_path: Path) -> None:
    record = _record()
    path = write_record(record, tmp_path)
    loaded = read_record(path)
    assert loaded.schema == SCHEMA_VERSION
    assert loaded.metrics == record.metrics
    assert loaded.samples == {"ttft_ms": (1.0, 2.5)}
    assert loaded.host == record.host
    assert loaded.git == record.git
    assert loaded.server_version == {"version": "1.2.3"}
    assert loaded.details == {"note": "x"}
    # JSON has no infinity: an unbounded rate is recorded as null.
    assert loaded.params["load"]["request_rate"] is None


def test_records_the_checkout_state() -> None:
    record = _record()
    # The tests run inside the monorepo's git checkout.
    assert record.git.sha is not None
    assert len(record.git.sha) == 40
    assert record.git.is_dirty in (True, False)
    assert record.recorded_at.endswith("Z")


def test_path_names_benchmark_time_and_sha(tmp_path: Path) -> None:
    record = _record(recorded_at="2026-01-02T03:04:05Z", git=GitState(sha="a" * 40, is_dirty=False))
    first = write_record(record, tmp_path)
    second = write_record(record, tmp_path)
    assert first == tmp_path / "serve" / "20260102T030405-aaaaaaaaaa.json"
    assert second.name == "20260102T030405-aaaaaaaaaa-2.json"
    assert json.loads(first.read_text()) == json.loads(second.read_text())


def test_outside_git_the_sha_is_none(tmp_path: Path) -> None:
    assert GitState.read(tmp_path) == GitState(sha=None, is_dirty=None)
    record = _record(git=GitState(sha=None, is_dirty=None))
    assert record.file_stem.endswith("-nogit")


def test_other_schema_is_refused(tmp_path: Path) -> None:
    path = write_record(_record(), tmp_path)
    data = json.loads(path.read_text())
    data["schema"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="schema"):
        read_record(path)


def test_missing_field_is_refused(tmp_path: Path) -> None:
    path = write_record(_record(), tmp_path)
    data = json.loads(path.read_text())
    del data["metrics"]
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="metrics"):
        read_record(path)


def test_find_records_skips_other_json(tmp_path: Path) -> None:
    old = write_record(_record(recorded_at="2025-01-01T00:00:00Z"), tmp_path)
    new = write_record(_record(recorded_at="2026-01-01T00:00:00Z", benchmark="ttft"), tmp_path)
    (tmp_path / "serve" / "notes.json").write_text('{"hello": 1}')
    (tmp_path / "broken.json").write_text("{")
    assert [path for path, _ in find_records(tmp_path)] == [old, new]
