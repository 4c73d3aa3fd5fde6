"""``BenchRecord``: one benchmark run as a JSON file (schema-versioned wire type)."""

from __future__ import annotations

import datetime as dt
import json
import math
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from metrale_bench.host import HostDescription, describe_host
from metrale_bench.types import Metrics, MetricValue, Params

SCHEMA_VERSION = 1
SHA_CHARS = 10


class RecordError(ValueError):
    """A file that is not a benchmark record this version can read."""


@attrs.frozen(kw_only=True)
class GitState:
    """The commit the harness ran from; ``None`` fields outside a git checkout."""

    sha: str | None
    is_dirty: bool | None

    @classmethod
    def read(cls, cwd: Path | None = None) -> GitState:
        sha = _git(["rev-parse", "HEAD"], cwd)
        status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
        return cls(sha=sha, is_dirty=None if status is None else bool(status))


def _git(args: list[str], cwd: Path | None) -> str | None:
    try:
        result = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


@attrs.frozen(kw_only=True)
class BenchRecord:
    """What a run measured and everything needed to reproduce and compare it.

    ``metrics`` is a flat name → number map (``None``: a reading that could not be taken);
    ``samples`` holds per-request values (e.g. ``ttft_ms``) for plots; ``errors`` the first
    distinct failure messages. ``server_version`` is the server's ``GET /version`` document;
    ``details`` holds documents a driver read besides its metrics (e.g. ``/memory``).
    """

    benchmark: str
    recorded_at: str
    git: GitState
    command: tuple[str, ...]
    base_url: str
    model: str | None
    server_version: Mapping[str, Any] | None
    host: HostDescription
    params: Params
    metrics: Metrics
    samples: Mapping[str, tuple[float, ...]] = attrs.field(factory=dict)
    num_failed: int = 0
    errors: tuple[str, ...] = ()
    details: Mapping[str, Any] = attrs.field(factory=dict)
    schema: int = SCHEMA_VERSION

    @property
    def file_stem(self) -> str:
        """``<date>T<time>-<sha10>``: records of one benchmark sort by time."""
        stamp = self.recorded_at.replace(":", "").replace("-", "")[:15]
        sha = (self.git.sha or "nogit")[:SHA_CHARS]
        return f"{stamp}-{sha}"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "benchmark": self.benchmark,
            "recorded_at": self.recorded_at,
            "git": attrs.asdict(self.git),
            "command": list(self.command),
            "base_url": self.base_url,
            "model": self.model,
            "server_version": None if self.server_version is None else dict(self.server_version),
            "host": attrs.asdict(self.host),
            "params": _finite(dict(self.params)),
            "metrics": {k: _finite_number(v) for k, v in self.metrics.items()},
            "num_failed": self.num_failed,
            "errors": list(self.errors),
            "details": _finite(dict(self.details)),
            "samples": {k: list(v) for k, v in self.samples.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BenchRecord:
        """Parse a record; raises :class:`RecordError` for another schema or a missing field."""
        if not isinstance(data, Mapping):
            raise RecordError("a record is a JSON object")
        if data.get("schema") != SCHEMA_VERSION:
            raise RecordError(f"record schema {data.get('schema')!r}, expected {SCHEMA_VERSION}")
        try:
            return cls(
                schema=data["schema"],
                benchmark=data["benchmark"],
                recorded_at=data["recorded_at"],
                git=GitState(**data["git"]),
                command=tuple(data["command"]),
                base_url=data["base_url"],
                model=data["model"],
                server_version=data["server_version"],
                host=HostDescription(**data["host"]),
                params=data["params"],
                metrics=data["metrics"],
                samples={k: tuple(v) for k, v in data.get("samples", {}).items()},
                num_failed=data["num_failed"],
                errors=tuple(data.get("errors", ())),
                details=data.get("details", {}),
            )
        except (KeyError, TypeError) as error:
            raise RecordError(f"a record field is missing or malformed: {error}") from error


def new_record(
    *,
    benchmark: str,
    command: Sequence[str],
    base_url: str,
    model: str | None,
    server_version: Mapping[str, Any] | None,
    params: Params,
    metrics: Mapping[str, MetricValue],
    samples: Mapping[str, Sequence[float]] | None = None,
    num_failed: int = 0,
    errors: Sequence[str] = (),
    details: Mapping[str, Any] | None = None,
) -> BenchRecord:
    """A record stamped now (UTC) with this checkout's git state and this host."""
    return BenchRecord(
        benchmark=benchmark,
        recorded_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        git=GitState.read(),
        command=tuple(command),
        base_url=base_url,
        model=model,
        server_version=server_version,
        host=describe_host(),
        params=params,
        metrics=dict(metrics),
        samples={k: tuple(v) for k, v in (samples or {}).items()},
        num_failed=num_failed,
        errors=tuple(errors),
        details=dict(details or {}),
    )


def write_record(record: BenchRecord, directory: Path) -> Path:
    """Write ``directory/<benchmark>/<stem>.json`` (a numeric suffix avoids overwriting)."""
    folder = directory / record.benchmark
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{record.file_stem}.json"
    counter = 1
    while path.exists():
        counter += 1
        path = folder / f"{record.file_stem}-{counter}.json"
    path.write_text(json.dumps(record.to_json(), indent=1, allow_nan=False) + "\n")
    return path


def read_record(path: Path) -> BenchRecord:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise RecordError(f"{path}: {error}") from error
    try:
        return BenchRecord.from_json(data)
    except RecordError as error:
        raise RecordError(f"{path}: {error}") from error


def find_records(directory: Path) -> list[tuple[Path, BenchRecord]]:
    """Every readable record under ``directory``, oldest first; other JSON files are skipped."""
    found = []
    for path in sorted(directory.rglob("*.json")):
        try:
            found.append((path, read_record(path)))
        except RecordError:
            continue
    return sorted(found, key=lambda item: (item[1].recorded_at, str(item[0])))


def _finite_number(value: MetricValue) -> MetricValue:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _finite(value: Any) -> Any:
    """JSON has no infinity or NaN: they become ``None``."""
    if isinstance(value, float):
        return _finite_number(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
