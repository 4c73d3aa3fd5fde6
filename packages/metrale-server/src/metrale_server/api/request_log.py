"""One log line per finished request: id, token counts, latency, finish reason; never text."""

from __future__ import annotations

import logging
import time

from metrale_server.api.metrics import RequestTracker, ServerMetrics
from metrale_server.output.outputs import RequestOutput

logger = logging.getLogger("metrale.requests")


class LoggingServerMetrics(ServerMetrics):
    """``ServerMetrics`` whose trackers also log each request when its last output arrives.

    The tracker sees outputs as the API reports them (a request cut by the timeout already
    says ``length``). A client that leaves early ends its request without a last output, so
    that request has no line.
    """

    def track(self) -> RequestTracker:
        return _LoggingTracker(self)


class _LoggingTracker(RequestTracker):
    def __init__(self, metrics: ServerMetrics) -> None:
        super().__init__(metrics)
        self._started_at = time.monotonic()
        self._is_logged = False

    def observe(self, output: RequestOutput) -> None:
        super().observe(output)
        if output.finished and not self._is_logged:
            self._is_logged = True
            logger.info(format_finished(output, time.monotonic() - self._started_at))


def format_finished(output: RequestOutput, latency_s: float) -> str:
    if output.error is not None:
        return f"{output.request_id} failed after {latency_s:.3f} s: {output.error}"
    num_completion = sum(o.num_tokens for o in output.outputs)
    reasons = ",".join(str(o.finish_reason) for o in output.outputs)
    return (
        f"{output.request_id} prompt_tokens={len(output.prompt_token_ids)} "
        f"completion_tokens={num_completion} latency={latency_s:.3f}s finish_reason={reasons}"
    )
