"""``Snapshot``: one reading of a server through its HTTP endpoints, parsed at the edge.

A part the server did not answer is ``None`` (shown as "n/a"), never a made-up number.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

from metrale_bench.wire import MemoryReport
from metrale_server.api.recent_requests import FinishedRequest
from metrale_server.tui.metrics_reading import MetricsReading


class Status(enum.Enum):
    """The header's pill. ``OFFLINE``: nothing answered at the address."""

    LOADING = "LOADING"
    SERVING = "SERVING"
    DRAINING = "DRAINING"
    FAULTED = "FAULTED"
    OFFLINE = "OFFLINE"

    @classmethod
    def from_health(cls, http_status: int, body: Mapping[str, Any]) -> Status:
        """``/health``'s answer: 200 ready; 503 with ``status`` loading, draining or faulted."""
        if http_status == 200:
            return cls.SERVING
        word = str(body.get("status", "")).lower()
        if word == "loading":
            return cls.LOADING
        if word == "draining":
            return cls.DRAINING
        return cls.FAULTED


@attrs.frozen(kw_only=True)
class ServerInfo:
    """``GET /v1/server``: what the engine was built with (the header's chips)."""

    model: str
    dtype: str
    device: str
    num_kv_blocks: int
    block_size: int
    max_batch_size: int
    max_seq_len: int
    started_at: float
    is_prefix_caching: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServerInfo:
        """Raises ``ValueError`` when a field is missing or has the wrong type."""
        try:
            return cls(
                model=str(data["model"]),
                dtype=str(data["dtype"]),
                device=str(data["device"]),
                num_kv_blocks=int(data["num_kv_blocks"]),
                block_size=int(data["block_size"]),
                max_batch_size=int(data["max_batch_size"]),
                max_seq_len=int(data["max_seq_len"]),
                started_at=float(data["started_at"]),
                is_prefix_caching=bool(data.get("is_prefix_caching", False)),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"/v1/server: {error!r}") from error


def loading_progress_from_health(body: Mapping[str, Any]) -> tuple[int, int] | None:
    """``/health``'s ``progress`` while loading, ``(done, total)``; ``None`` if absent or bad."""
    progress = body.get("progress")
    if not isinstance(progress, Mapping):
        return None
    done, total = progress.get("done"), progress.get("total")
    if not isinstance(done, int) or not isinstance(total, int) or total <= 0:
        return None
    return (min(max(done, 0), total), total)


def finished_request_from_json(data: Mapping[str, Any]) -> FinishedRequest:
    """One entry of ``GET /v1/requests/recent``; raises ``ValueError`` on a bad shape."""
    try:
        return FinishedRequest(
            request_id=str(data["request_id"]),
            num_prompt_tokens=int(data["num_prompt_tokens"]),
            num_completion_tokens=int(data["num_completion_tokens"]),
            latency_s=float(data["latency_s"]),
            finish_reason=str(data["finish_reason"]),
            finished_at=float(data["finished_at"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"/v1/requests/recent: {error!r}") from error


@attrs.frozen(kw_only=True)
class Snapshot:
    """Everything a dashboard frame shows about the server, read at ``taken_at`` (monotonic
    seconds). ``model`` is the name ``/health`` or ``/v1/models`` gave."""

    url: str
    status: Status
    taken_at: float
    model: str | None = None
    server: ServerInfo | None = None
    metrics: MetricsReading | None = None
    memory: MemoryReport | None = None
    recent_requests: tuple[FinishedRequest, ...] = ()
    version: str | None = None
    error: str | None = None
    # While loading: checkpoint tensors (done, total) from /health, when the server says.
    loading_progress: tuple[int, int] | None = None
