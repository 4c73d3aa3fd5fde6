"""``AsyncEngine``: the engine on its own thread, streaming outputs to asyncio consumers."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Sequence

import attrs

from metrale_server.engine.core import Engine, RequestError
from metrale_server.output.outputs import RequestOutput
from metrale_server.sampling.params import SamplingParams

logger = logging.getLogger(__name__)


@attrs.frozen
class _Add:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    prompt: str | None


@attrs.frozen
class _Abort:
    request_id: str


@attrs.frozen
class _Stop:
    pass


_Command = _Add | _Abort | _Stop


class EngineDeadError(RuntimeError):
    """The engine thread stopped; no request can be served."""


class AsyncEngine:
    """Drives an ``Engine`` on a dedicated thread so the event loop never waits on torch.

    Contract: ``add_request`` validates on the caller's side (raising ``RequestError`` at once
    for a request that can never run) and returns an async iterator of incremental outputs,
    the last one ``finished``. Leaving the iterator early (a client disconnect) aborts the
    request. ``abort`` frees everything the request holds. An exception inside a step fails
    the requests in flight (their last output carries ``error``) and the engine goes on.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._streams: dict[
            str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[RequestOutput]]
        ] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="metrale-engine", daemon=True)
        self._is_stopped = False
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        if not self.is_running:
            raise EngineDeadError("the engine thread is not running")
        prompt_ids = tuple(int(t) for t in prompt_token_ids)
        params = self.engine.check_request(prompt_ids, params)
        loop = asyncio.get_running_loop()
        stream: asyncio.Queue[RequestOutput] = asyncio.Queue()
        with self._lock:
            if request_id in self._streams:
                raise RequestError(f"request id {request_id!r} is already running")
            self._streams[request_id] = (loop, stream)
        self._commands.put(_Add(request_id, prompt_ids, params, prompt))
        return self._iterate(request_id, stream)

    async def _iterate(
        self, request_id: str, stream: asyncio.Queue[RequestOutput]
    ) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while not finished:
                output = await stream.get()
                finished = output.finished
                yield output
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    def shutdown(self, timeout: float | None = 10.0) -> None:
        self._commands.put(_Stop())
        self._thread.join(timeout)

    def _publish(self, output: RequestOutput) -> None:
        with self._lock:
            target = self._streams.get(output.request_id)
            if target is not None and output.finished:
                del self._streams[output.request_id]
        if target is not None:
            loop, stream = target
            loop.call_soon_threadsafe(stream.put_nowait, output)

    def _run(self) -> None:
        while True:
            block = not self.engine.has_unfinished_requests()
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                command = None
            while command is not None:
                if isinstance(command, _Stop):
                    self._fail_all("the engine is shutting down")
                    return
                self._apply(command)
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
            if not self.engine.has_unfinished_requests():
                continue
            try:
                outputs = self.engine.step()
            except Exception as error:
                logger.exception("engine step failed")
                self._fail_all(f"internal error in the engine step: {error}")
                continue
            for output in outputs:
                self._publish(output)

    def _apply(self, command: _Add | _Abort) -> None:
        if isinstance(command, _Add):
            try:
                self.engine.add_request(
                    command.request_id,
                    command.prompt_token_ids,
                    command.params,
                    prompt=command.prompt,
                )
            except Exception as error:
                self._publish(self._error_output(command.request_id, str(error)))
            return
        output = self.engine.abort(command.request_id)
        if output is not None:
            self._publish(output)

    def _fail_all(self, message: str) -> None:
        with self._lock:
            request_ids = list(self._streams)
        for request_id in request_ids:
            self.engine.abort(request_id)
            self._publish(self._error_output(request_id, message))

    @staticmethod
    def _error_output(request_id: str, message: str) -> RequestOutput:
        return RequestOutput(
            request_id=request_id, prompt_token_ids=(), outputs=(), finished=True, error=message
        )
