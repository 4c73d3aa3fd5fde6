"""One engine request as the API runs it: timeout, metrics, abort on the way out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Sequence

import attrs
from starlette.types import Receive

from metrale_server.api.errors import ApiError
from metrale_server.api.protocol import Prompt
from metrale_server.api.state import ServerState
from metrale_server.engine.async_engine import EngineDeadError
from metrale_server.engine.core import RequestError
from metrale_server.output.outputs import RequestOutput
from metrale_server.structured import CompiledGrammar

# OpenAI's reason for output cut short; the log line says it was the timeout.
TIMEOUT_FINISH_REASON = "length"
RETRY_AFTER_S = 1  # a full queue drains as the batch finishes requests

logger = logging.getLogger(__name__)


class Generation:
    """An engine request, started on construction (a refusal raises ``ApiError`` at once).

    ``outputs()`` yields its ``RequestOutput``s; past ``state.request_timeout_s`` the request is
    aborted and its unfinished outputs end with finish_reason ``"length"`` (a warning names the
    request and the timeout). ``close()`` (run
    when ``outputs()`` is left, or by the owner of a generation never iterated) aborts the
    request if it has not finished, so its KV blocks are freed.
    """

    def __init__(
        self,
        state: ServerState,
        request_id: str,
        prompt: Prompt,
        grammar: CompiledGrammar | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self._state = state
        try:
            self._stream = state.engine.add_request(
                request_id,
                prompt.token_ids,
                prompt.params,
                prompt=prompt.text,
                grammar=grammar,
                images=prompt.images,
            )
        except RequestError as error:
            raise ApiError(400, str(error)) from error
        except EngineDeadError as error:
            raise ApiError(503, str(error)) from error
        self._tracker = state.metrics.track()
        self.is_timed_out = False
        self._is_finished = False
        self._is_closed = False
        self._timer = (
            None
            if state.request_timeout_s is None
            else asyncio.get_running_loop().call_later(state.request_timeout_s, self._expire)
        )
        state.num_active_requests += 1

    async def outputs(self) -> AsyncGenerator[RequestOutput, None]:
        try:
            async for output in self._stream:
                if self.is_timed_out:
                    output = _as_timed_out(output)
                self._is_finished = output.finished
                self._tracker.observe(output)
                yield output
        finally:
            self.close()
            if isinstance(self._stream, AsyncGenerator):
                await self._stream.aclose()

    def abort(self) -> None:
        if not self._is_finished:
            self._state.engine.abort(self.request_id)

    def close(self) -> None:
        """Idempotent and synchronous, so it is safe in any ``finally``."""
        if self._is_closed:
            return
        self._is_closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._state.num_active_requests -= 1
        if not self._is_finished:
            self._tracker.abandoned(self.request_id, len(self.prompt.token_ids))
        self.abort()

    def _expire(self) -> None:
        self.is_timed_out = True
        logger.warning(
            "request %s timed out after %g s (--request-timeout); its outputs end with "
            "finish_reason %r",
            self.request_id,
            self._state.request_timeout_s,
            TIMEOUT_FINISH_REASON,
        )
        self.abort()


def _as_timed_out(output: RequestOutput) -> RequestOutput:
    outputs = tuple(
        attrs.evolve(o, finish_reason=TIMEOUT_FINISH_REASON) if o.finish_reason == "abort" else o
        for o in output.outputs
    )
    return attrs.evolve(output, outputs=outputs)


def start_generations(
    state: ServerState,
    response_id: str,
    prompts: Sequence[Prompt],
    grammar: CompiledGrammar | None = None,
) -> list[Generation]:
    """One generation per prompt; if one is refused, those already started are aborted. A 429
    when they would not fit in the queue (``state.max_queued_requests``). ``grammar``: the
    prompts' constraint as ``compile_structured`` compiled it."""
    if state.is_draining:
        raise ApiError(503, "the server is shutting down", code="server_shutting_down")
    check_queue_room(state, len(prompts))
    generations: list[Generation] = []
    try:
        for index, prompt in enumerate(prompts):
            generations.append(Generation(state, f"{response_id}-{index}", prompt, grammar))
    except BaseException:
        for generation in generations:
            generation.close()
        raise
    return generations


def check_queue_room(state: ServerState, num_new: int) -> None:
    """Raises a 429 (``Retry-After``) when ``num_new`` more requests would wait past the bound:
    those in flight here less those the engine runs are waiting."""
    limit = state.max_queued_requests
    if limit is None:
        return
    running = state.engine.stats.num_running_requests
    waiting = max(0, state.num_active_requests - running)
    if waiting + num_new > limit:
        raise ApiError(
            429,
            f"the server is at capacity: {waiting} requests are waiting for the running batch "
            f"(at most {limit}, met serve --max-queued-requests); retry later",
            code="queue_full",
            type="rate_limit_error",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )


def close_all(generations: Sequence[Generation]) -> None:
    for generation in generations:
        generation.close()


async def merge_outputs(
    generations: Sequence[Generation],
) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """``(prompt index, output)`` from every generation as they come; leaving early closes all."""
    if len(generations) == 1:
        try:
            async for output in generations[0].outputs():
                yield 0, output
        finally:
            generations[0].close()
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, generation: Generation) -> None:
        try:
            async for output in generation.outputs():
                queue.put_nowait((index, output))
            queue.put_nowait((index, None))
        except Exception as error:
            queue.put_nowait((index, error))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(generations)]
    try:
        num_running = len(tasks)
        while num_running:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                num_running -= 1
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for generation in generations:
            generation.close()


async def final_outputs(generations: Sequence[Generation], receive: Receive) -> list[RequestOutput]:
    """Each generation's finished output; a client that disconnects meanwhile aborts them."""
    finals: list[RequestOutput | None] = [None] * len(generations)
    watcher = asyncio.create_task(_abort_on_disconnect(receive, generations))
    merged = merge_outputs(generations)
    try:
        async for index, output in merged:
            finals[index] = output
    finally:
        watcher.cancel()
        await merged.aclose()
        close_all(generations)
    assert all(final is not None for final in finals)
    return [final for final in finals if final is not None]


async def _abort_on_disconnect(receive: Receive, generations: Sequence[Generation]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    for generation in generations:
        generation.abort()
