"""The last finished requests (id, token counts, latency, finish reason), never their text.

``GET /v1/requests/recent`` lists them, newest first, for dashboards such as ``met top``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metrale_server.output.outputs import RequestOutput

DEFAULT_NUM_KEPT = 64
ERROR_FINISH_REASON = "error"
# A request whose client left, or that was aborted, before its last output (vLLM's word).
ABORT_FINISH_REASON = "abort"


@attrs.frozen(kw_only=True)
class FinishedRequest:
    """One finished request as a dashboard shows it; there is no field for prompt or output
    text, so none can leak."""

    request_id: str
    num_prompt_tokens: int
    num_completion_tokens: int
    latency_s: float
    finish_reason: str
    finished_at: float

    @classmethod
    def from_output(cls, output: RequestOutput, latency_s: float) -> FinishedRequest:
        reasons = {str(o.finish_reason) for o in output.outputs if o.finish_reason is not None}
        if output.error is not None:
            reason = ERROR_FINISH_REASON
        else:
            reason = ",".join(sorted(reasons)) or "unknown"
        return cls(
            request_id=output.request_id,
            num_prompt_tokens=len(output.prompt_token_ids),
            num_completion_tokens=sum(o.num_tokens for o in output.outputs),
            latency_s=latency_s,
            finish_reason=reason,
            finished_at=time.time(),
        )

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


class RecentRequests:
    """A bounded ring of ``FinishedRequest``; safe to add to and read from any thread."""

    def __init__(self, num_kept: int = DEFAULT_NUM_KEPT) -> None:
        self._ring: deque[FinishedRequest] = deque(maxlen=num_kept)
        self._lock = threading.Lock()

    def add(self, request: FinishedRequest) -> None:
        with self._lock:
            self._ring.append(request)

    def newest_first(self) -> list[FinishedRequest]:
        with self._lock:
            return list(reversed(self._ring))


async def list_recent_requests(request: Request, *, recent: RecentRequests) -> Response:
    return JSONResponse({"object": "list", "data": [r.to_json() for r in recent.newest_first()]})
