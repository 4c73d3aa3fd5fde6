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
    says ``length``). A request whose client leaves early ends without a last output: its line
    says it was aborted, with the tokens made until then.
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

    def abandoned(self, request_id: str, num_prompt_tokens: int) -> None:
        super().abandoned(request_id, num_prompt_tokens)
        if not self._is_logged:
            self._is_logged = True
            logger.info(
                "%s aborted before its last output: prompt_tokens=%d completion_tokens=%d "
                "latency=%.3fs finish_reason=abort",
                request_id,
                num_prompt_tokens,
                self._num_completion_tokens,
                time.monotonic() - self._started_at,
            )


def format_finished(output: RequestOutput, latency_s: float) -> str:
    if output.error is not None:
        return f"{output.request_id} failed after {latency_s:.3f} s: {output.error}"
    num_completion = sum(o.num_tokens for o in output.outputs)
    reasons = ",".join(str(o.finish_reason) for o in output.outputs)
    return (
        f"{output.request_id} prompt_tokens={len(output.prompt_token_ids)} "
        f"completion_tokens={num_completion} latency={latency_s:.3f}s finish_reason={reasons}"
    )
