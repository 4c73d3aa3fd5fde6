"""What every driver does around its load: identify the server, warm up, record parameters."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from metrale_bench.datasets import BenchRequest
from metrale_bench.load import LoadResult, LoadSpec, run_load
from metrale_bench.progress import request_progress
from metrale_bench.streaming import SamplingSpec
from metrale_bench.target import ServerTarget, resolve_model, server_version


@attrs.frozen(kw_only=True)
class ServerIdentity:
    """The model name a run sends and the server's ``/version`` document."""

    model: str
    version: dict[str, Any] | None


async def identify(target: ServerTarget) -> ServerIdentity:
    async with target.client() as client:
        return ServerIdentity(
            model=await resolve_model(client, target), version=await server_version(client)
        )


async def warm_up(
    target: ServerTarget, model: str, requests: Sequence[BenchRequest], sampling: SamplingSpec
) -> None:
    """Send ``requests`` one at a time and discard the outcomes (first-call costs, caches)."""
    if requests:
        await run_load(target, model, requests, load=LoadSpec(max_concurrency=1), sampling=sampling)


async def measured_load(
    target: ServerTarget,
    model: str,
    requests: Sequence[BenchRequest],
    *,
    load: LoadSpec,
    sampling: SamplingSpec,
    label: str,
    show_progress: bool,
) -> LoadResult:
    with request_progress(label, len(requests), enabled=show_progress) as on_outcome:
        return await run_load(
            target, model, requests, load=load, sampling=sampling, on_outcome=on_outcome
        )


def as_params(value: object) -> dict[str, Any]:
    """An attrs instance as JSON-ready parameters (paths become strings)."""

    def serialize(_: object, __: object, field_value: Any) -> Any:
        return str(field_value) if isinstance(field_value, Path) else field_value

    return attrs.asdict(value, value_serializer=serialize)  # type: ignore[arg-type]


def target_params(target: ServerTarget) -> dict[str, Any]:
    """The target's recorded parameters (never the API key)."""
    return {"api": target.api, "timeout_s": target.timeout_s}
