"""Server-sent events: ``data: {json}\\n\\n`` frames (after an ``event: <name>`` line where
the API names its events), ``data: [DONE]\\n\\n`` last on OpenAI's chat and completions."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from metrale_server.api.errors import ApiError, internal_error

DONE_EVENT = "data: [DONE]\n\n"
ErrorFrame = Callable[[ApiError], str]


def sse_event(payload: Mapping[str, Any], *, name: str | None = None) -> str:
    """One frame of ``payload``; ``name``: its ``event:`` line."""
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    head = "" if name is None else f"event: {name}\n"
    return f"{head}data: {text}\n\n"


def openai_error_frame(error: ApiError) -> str:
    return sse_event(error.to_body())


async def guarded_events(
    events: AsyncGenerator[str, None], error_frame: ErrorFrame, end: str | None
) -> AsyncGenerator[str, None]:
    """``events`` then ``end``; a failure mid-stream becomes ``error_frame`` of it (a 500's,
    naming an error id, for anything but an ``ApiError``)."""
    try:
        async for event in events:
            yield event
    except ApiError as error:
        yield error_frame(error)
    except Exception:
        yield error_frame(internal_error("internal error in an event stream"))
    finally:
        await events.aclose()
    if end is not None:
        yield end


class EventStreamResponse(StreamingResponse):
    """An SSE response that always closes its event generator, whether the stream ends, fails or
    the client goes away, so the requests behind it are aborted and their KV blocks freed."""

    def __init__(
        self,
        events: AsyncGenerator[str, None],
        *,
        on_close: Callable[[], None] | None = None,
        error_frame: ErrorFrame = openai_error_frame,
        end: str | None = DONE_EVENT,
    ) -> None:
        """``error_frame`` frames a failure mid-stream and ``end`` (if any) ends the stream;
        OpenAI's chat and completions frames by default."""
        self._events = guarded_events(events, error_frame, end)
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
