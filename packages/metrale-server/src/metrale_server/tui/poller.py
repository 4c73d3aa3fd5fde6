"""``HttpPoller``: reads a server's ``/health``, ``/metrics``, ``/v1/server``,
``/v1/requests/recent``, ``/memory`` and ``/version`` into a ``Snapshot``.

Only the standard library talks HTTP, so ``met top`` needs nothing the server lacks. Parts
that rarely change (server info, version) are read once; ``/memory`` every
``memory_interval_s``; the last requests only when ``/metrics`` counts new finished ones
(a request that failed shows with the next one that finishes). An endpoint that answers
404 (an older server) leaves its part ``None``.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

from metrale_bench.wire import MemoryReport, MemoryReportError
from metrale_server.api.recent_requests import FinishedRequest
from metrale_server.tui.metrics_reading import MetricsReading
from metrale_server.tui.snapshot import (
    ServerInfo,
    Snapshot,
    Status,
    finished_request_from_json,
    loading_progress_from_health,
)

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MEMORY_INTERVAL_S = 5.0


class _UnreachableError(Exception):
    pass


class HttpPoller:
    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_interval_s: float = DEFAULT_MEMORY_INTERVAL_S,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._api_key = api_key
        self._tls_context = tls_context
        self._timeout_s = timeout_s
        self._memory_interval_s = memory_interval_s
        self._server: ServerInfo | None = None
        self._version: str | None = None
        self._memory: MemoryReport | None = None
        self._memory_read_at: float | None = None
        self._recent: tuple[FinishedRequest, ...] = ()
        self._num_finished: int | None = None

    def poll(self) -> Snapshot:
        """One snapshot; never raises for a server that is down or answers badly."""
        now = time.monotonic()
        try:
            status_code, health = self._get_json("/health")
        except _UnreachableError as error:
            return Snapshot(url=self.url, status=Status.OFFLINE, taken_at=now, error=str(error))
        status = Status.from_health(status_code, health)
        errors: list[str] = []
        model = health.get("model") if isinstance(health.get("model"), str) else None
        metrics = None
        recent: tuple[FinishedRequest, ...] = ()
        if status is not Status.LOADING:
            metrics = self._read_part(errors, self._read_metrics)
            num_finished = None if metrics is None else metrics.num_finished
            if num_finished is None or num_finished != self._num_finished:
                self._recent = self._read_part(errors, self._read_recent) or ()
                self._num_finished = num_finished
            recent = self._recent
            if self._server is None:
                self._server = self._read_part(errors, self._read_server)
            if self._is_memory_due(now):
                self._memory_read_at = now
                self._memory = self._read_part(errors, self._read_memory)
        if self._version is None:
            self._version = self._read_part(errors, self._read_version)
        return Snapshot(
            url=self.url,
            status=status,
            taken_at=now,
            model=model or (self._server.model if self._server else None),
            server=self._server,
            metrics=metrics,
            memory=self._memory,
            recent_requests=recent,
            version=self._version,
            error="; ".join(errors) or None,
            loading_progress=(
                loading_progress_from_health(health) if status is Status.LOADING else None
            ),
        )

    def _is_memory_due(self, now: float) -> bool:
        return self._memory_read_at is None or now - self._memory_read_at >= self._memory_interval_s

    @staticmethod
    def _read_part(errors: list[str], read: Any) -> Any:
        try:
            return read()
        except (_UnreachableError, ValueError) as error:
            errors.append(str(error))
            return None

    def _read_metrics(self) -> MetricsReading | None:
        status, body = self._get("/metrics")
        if status != 200:
            return None
        return MetricsReading.from_prometheus_text(body.decode("utf-8", errors="replace"))

    def _read_recent(self) -> tuple[FinishedRequest, ...] | None:
        status, data = self._get_json("/v1/requests/recent")
        if status != 200:
            return None
        return tuple(finished_request_from_json(item) for item in data.get("data", []))

    def _read_server(self) -> ServerInfo | None:
        status, data = self._get_json("/v1/server")
        return ServerInfo.from_json(data) if status == 200 else None

    def _read_memory(self) -> MemoryReport | None:
        status, data = self._get_json("/memory")
        if status != 200:
            return None
        try:
            return MemoryReport.from_json(data)
        except MemoryReportError as error:
            raise ValueError(str(error)) from error

    def _read_version(self) -> str | None:
        status, data = self._get_json("/version")
        return str(data["version"]) if status == 200 and "version" in data else None

    def _get_json(self, path: str) -> tuple[int, dict[str, Any]]:
        status, body = self._get(path)
        try:
            data = json.loads(body)
        except ValueError:
            data = {}
        return status, data if isinstance(data, dict) else {}

    def _get(self, path: str) -> tuple[int, bytes]:
        request = urllib.request.Request(f"{self.url}{path}")
        if self._api_key:
            request.add_header("Authorization", f"Bearer {self._api_key}")
        try:
            with urllib.request.urlopen(
                request, timeout=self._timeout_s, context=self._tls_context
            ) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read()
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise _UnreachableError(f"{self.url}{path}: {reason}") from error
