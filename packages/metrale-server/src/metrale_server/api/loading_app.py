"""``LoadingApp``: the ASGI app in front of the API while the model loads.

Until ``serve(app)`` is called, ``/health`` answers 503 ``loading`` (with the checkpoint tensors
loaded so far, once the loader reports them), ``/health/live`` 200 and every other path a 503 in
the OpenAI error shape; afterwards every request goes to the given app. It completes the ASGI
lifespan itself (the API app must not need lifespan events).
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

LOADING_CODE = "model_not_loaded"


class LoadingApp:
    def __init__(self, served_model_name: str) -> None:
        self.served_model_name = served_model_name
        self._app: ASGIApp | None = None
        # (done, total) checkpoint tensors; replaced whole from the loading thread.
        self._progress: tuple[int, int] | None = None

    @property
    def is_serving(self) -> bool:
        return self._app is not None

    def set_progress(self, done: int, total: int) -> None:
        """The loader's progress observer (called from the loading thread)."""
        self._progress = (done, total)

    def serve(self, app: ASGIApp) -> None:
        """Hand every request from now on to ``app``."""
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _complete_lifespan(receive, send)
        elif self._app is not None:
            await self._app(scope, receive, send)
        elif scope["type"] == "http":
            await self._loading_response(scope["path"])(scope, receive, send)

    def _loading_response(self, path: str) -> JSONResponse:
        if path == "/health/live":
            return JSONResponse({"status": "ok"})
        if path == "/health":
            body: dict[str, object] = {"status": "loading", "model": self.served_model_name}
            progress = self._progress
            if progress is not None:
                body["progress"] = {"done": progress[0], "total": progress[1]}
            return JSONResponse(body, status_code=503)
        error = {
            "message": "the model is still loading; retry when /health answers 200",
            "type": "service_unavailable_error",
            "param": None,
            "code": LOADING_CODE,
        }
        return JSONResponse({"error": error}, status_code=503, headers={"Retry-After": "1"})


async def _complete_lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
