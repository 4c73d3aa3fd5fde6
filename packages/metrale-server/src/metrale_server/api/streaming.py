"""Server-sent events: ``data: {json}\\n\\n`` frames, ``data: [DONE]\\n\\n`` last."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from metrale_server.api.errors import ApiError, internal_error

DONE_EVENT = "data: [DONE]\n\n"
EventGuard = Callable[[AsyncGenerator[str, None]], AsyncGenerator[str, None]]


def sse_event(payload: Mapping[str, Any]) -> str:
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return f"data: {text}\n\n"


async def guarded_events(events: AsyncGenerator[str, None]) -> AsyncGenerator[str, None]:
    """``events`` then ``[DONE]``; a failure mid-stream becomes an OpenAI error event."""
    try:
        async for event in events:
            yield event
    except ApiError as error:
        yield sse_event(error.to_body())
    except Exception:
        yield sse_event(internal_error("internal error in an event stream").to_body())
    finally:
        await events.aclose()
    yield DONE_EVENT


class EventStreamResponse(StreamingResponse):
    """An SSE response that always closes its event generator, whether the stream ends, fails or
    the client goes away, so the requests behind it are aborted and their KV blocks freed."""

    def __init__(
        self,
        events: AsyncGenerator[str, None],
        *,
        on_close: Callable[[], None] | None = None,
        guard: EventGuard = guarded_events,
    ) -> None:
        """``guard`` frames the stream's end and a failure mid-stream (OpenAI's by default)."""
        self._events = guard(events)
        self._on_close = on_close
        super().__init__(
            self._events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()
            if self._on_close is not None:
                self._on_close()
