"""``AsyncEngine``: the engine core on its own thread, outputs processed on the event loop."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import attrs

from metrale_model_arch import ChatTemplate, ImageEncoder, Tokenizer
from metrale_server.engine.client import EngineInfo
from metrale_server.engine.core import RequestError
from metrale_server.engine.core_request import EngineCoreRequest
from metrale_server.engine.engine import Engine
from metrale_server.engine.layer_compiler import LayerCompiler
from metrale_server.engine.prompt_image import PromptImage
from metrale_server.engine.stats import EngineStats
from metrale_server.memory.report import memory_report
from metrale_server.output.core_output import EngineCoreOutput
from metrale_server.output.outputs import RequestOutput
from metrale_server.output.processor import RequestOutputKind
from metrale_server.sampling.params import SamplingParams
from metrale_server.structured import CompiledGrammar, GrammarCompiler

logger = logging.getLogger(__name__)


@attrs.frozen
class _Add:
    request: EngineCoreRequest


@attrs.frozen
class _Abort:
    request_id: str
    indices: tuple[int, ...] | None = None


@attrs.frozen
class _Stop:
    pass


_Command = _Add | _Abort | _Stop


class EngineDeadError(RuntimeError):
    """The engine thread stopped; no request can be served."""


class AsyncEngine:
    """Drives an ``EngineCore`` on a dedicated thread so the event loop never waits on torch.

    The engine thread only schedules, runs the model and samples; each step's token ids go to
    the event loop in one call, where the output processor detokenizes them and applies stop
    strings (a match aborts those outputs in the core).

    Contract: ``add_request`` validates on the caller's side (raising ``RequestError`` at once
    for a request that can never run) and returns an async iterator of outputs that carry
    what is new (``RequestOutputKind.DELTA``), the last one ``finished`` and cumulative.
    Leaving the iterator early (a client disconnect) aborts the request. ``abort`` ends it
    with finish_reason ``abort``. An exception inside a step fails the requests in flight
    (their last output carries ``error``) and the engine goes on.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.core = engine.core
        self.info = engine_info(engine)
        self._processor = engine.processor
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._streams: dict[
            str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[RequestOutput]]
        ] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="metrale-engine", daemon=True)
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    # -- what the API reads (``EngineClient``) ----------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        return self.core.loaded.tokenizer

    @property
    def chat_template(self) -> ChatTemplate:
        return self.core.loaded.chat_template

    @property
    def image_encoder(self) -> ImageEncoder | None:
        step = self.core.runner.image_step
        return None if step is None else step.encoder

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        return self.core.loaded.render_chat(
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            template_kwargs=template_kwargs,
        )

    @property
    def grammar_compiler(self) -> GrammarCompiler:
        return self.core.grammar_compiler

    @property
    def stats(self) -> EngineStats:
        return self.core.published_stats

    def layer_steps(self) -> str:
        return LayerCompiler.state(self.core.compiler, self.core.loaded.model)

    def memory_document(self) -> dict[str, Any]:
        core = self.core
        document = memory_report(core.plan, core.ledger, core.loaded.device).to_json()
        if core.rank_memory:
            # Every rank's plan and ledger as each stood once loaded (nothing is allocated later).
            document["ranks"] = [rank.to_json() for rank in core.rank_memory]
        return document

    def live_bytes_by_owner(self) -> dict[str, int]:
        return self.core.ledger.live_bytes_by_owner()

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
        grammar: CompiledGrammar | None = None,
        images: Sequence[PromptImage] = (),
    ) -> AsyncIterator[RequestOutput]:
        """``grammar``: the request's constraint, compiled off the event loop by the caller;
        otherwise it is compiled (or found in the cache) here. The engine thread gets the
        compiled grammar and never compiles. ``images``: prepared by the caller
        (:attr:`image_encoder`), standing on the prompt's image tokens."""
        if not self.is_running:
            raise EngineDeadError("the engine thread is not running")
        request = self.core.make_request(
            request_id, prompt_token_ids, params, grammar=grammar, images=images
        )
        loop = asyncio.get_running_loop()
        stream: asyncio.Queue[RequestOutput] = asyncio.Queue()
        with self._lock:
            if request_id in self._streams:
                raise RequestError(f"request id {request_id!r} is already running")
            self._streams[request_id] = (loop, stream)
        self._processor.add_request(
            request_id, prompt, request.prompt_token_ids, request.params, RequestOutputKind.DELTA
        )
        self._commands.put(_Add(request))
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

    def _abort_outputs(self, request_id: str, indices: tuple[int, ...] | None) -> None:
        """End some outputs of a request (all with ``None``), on the engine thread."""
        self._commands.put(_Abort(request_id, indices))

    def shutdown(self, timeout: float | None = 10.0) -> None:
        self._commands.put(_Stop())
        self._thread.join(timeout)

    # -- the event loop's side --------------------------------------------------------------

    def _deliver(self, core_outputs: list[EngineCoreOutput]) -> None:
        for output in self._processor.apply_core_outputs(core_outputs, self._abort_outputs):
            with self._lock:
                target = self._streams.get(output.request_id)
                if target is not None and output.finished:
                    del self._streams[output.request_id]
            if target is not None:
                target[1].put_nowait(output)

    # -- the engine thread's side -----------------------------------------------------------

    def _publish(self, core_outputs: list[EngineCoreOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[EngineCoreOutput]] = {}
        with self._lock:
            for output in core_outputs:
                target = self._streams.get(output.request_id)
                if target is not None:
                    by_loop.setdefault(target[0], []).append(output)
        for loop, outputs in by_loop.items():
            try:
                loop.call_soon_threadsafe(self._deliver, outputs)
            except RuntimeError:  # that loop is closed: nobody is listening any more
                for output in outputs:
                    self.core.abort(output.request_id)

    def _run(self) -> None:
        while True:
            block = not self.core.has_unfinished_requests()
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                command = None
            published: list[EngineCoreOutput] = []
            while command is not None:
                if isinstance(command, _Stop):
                    self._fail_all("the engine is shutting down")
                    return
                output = self._apply(command)
                if output is not None:
                    published.append(output)
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
            if self.core.has_unfinished_requests():
                try:
                    published += self.core.step()
                except Exception as error:
                    logger.exception("engine step failed")
                    self._fail_all(f"internal error in the engine step: {error}")
            self.core.publish_stats()
            if published:
                self._publish(published)

    def _apply(self, command: _Add | _Abort) -> EngineCoreOutput | None:
        if isinstance(command, _Add):
            try:
                self.core.add_request(command.request)
            except Exception as error:
                return _error_output(command.request.request_id, str(error))
            return None
        return self.core.abort(command.request_id, command.indices)

    def _fail_all(self, message: str) -> None:
        with self._lock:
            request_ids = list(self._streams)
        for request_id in request_ids:
            self.core.abort(request_id)
        self._publish([_error_output(request_id, message) for request_id in request_ids])


def engine_info(engine: Engine) -> EngineInfo:
    """What ``engine`` was built with, as an ``EngineClient`` tells it."""
    core, loaded = engine.core, engine.loaded
    return EngineInfo(
        source=loaded.source,
        config=loaded.config,
        task=core.task,
        dtype=loaded.dtype,
        quantization=str(loaded.quantization),
        kernels=loaded.model.backend.describe(),
        device=loaded.device,
        max_seq_len=core.max_seq_len,
        max_batch_size=core.max_batch_size,
        max_batch_tokens=core.args.max_batch_tokens,
        num_kv_blocks=core.num_kv_blocks,
        block_size=core.block_size,
        kv_block_bytes=core.plan.kv_block_bytes,
        budget_bytes=core.plan.budget_bytes,
        is_prefix_caching=core.prefix_caching,
        images_per_prompt=0 if core.runner.image_step is None else core.args.images_per_prompt,
    )


def _error_output(request_id: str, message: str) -> EngineCoreOutput:
    return EngineCoreOutput(request_id=request_id, deltas=(), finished=True, error=message)
