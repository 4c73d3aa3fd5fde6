"""``OutputProcessor``: engine-core outputs (token ids) in, ``RequestOutput``s (text) out.

It runs outside the engine step — on the event loop for the server, after each step for
``LLM`` — and owns everything textual: incremental detokenization, stop strings, logprob
lists, finish reasons. A stop string it finds is reported back (``stopped``) so the caller
aborts those outputs in the core.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Sequence

import attrs

from metrale_server.output.core_output import EngineCoreOutput, SequenceDelta
from metrale_server.output.detokenizer import Decoder
from metrale_server.output.outputs import RequestOutput, TokenLogprob
from metrale_server.output.text_state import TextState
from metrale_server.sampling.params import SamplingParams

logger = logging.getLogger(__name__)


class RequestOutputKind(enum.Enum):
    """``CUMULATIVE``: every output carries the whole text so far; ``DELTA``: unfinished
    outputs carry only what is new (the finished one is cumulative); ``FINAL_ONLY``: only the
    finished output is produced."""

    CUMULATIVE = "cumulative"
    DELTA = "delta"
    FINAL_ONLY = "final_only"


@attrs.define(eq=False)
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    texts: list[TextState]
    kind: RequestOutputKind
    num_cached_tokens: int = 0
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    pooled: tuple[float, ...] | None = None

    @property
    def is_finished(self) -> bool:
        return all(text.is_finished for text in self.texts)


@attrs.frozen(kw_only=True)
class ProcessedOutputs:
    outputs: list[RequestOutput]
    # (request id, output indices) whose stop string was found: abort them in the core.
    stopped: list[tuple[str, tuple[int, ...]]]
    # Requests whose outputs could not be processed (each failed with an error output here):
    # abort them whole in the core.
    failed: list[str] = attrs.field(factory=list)


class OutputProcessor:
    def __init__(self, decoder: Decoder, eos_token_ids: Iterable[int]) -> None:
        self._decoder = decoder
        self._eos_token_ids = frozenset(eos_token_ids)
        self._requests: dict[str, RequestState] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        kind: RequestOutputKind = RequestOutputKind.CUMULATIVE,
    ) -> None:
        self._requests[request_id] = RequestState(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=tuple(prompt_token_ids),
            params=params,
            texts=[TextState(self._decoder, params) for _ in range(params.n)],
            kind=kind,
        )

    def apply_core_outputs(
        self,
        core_outputs: Iterable[EngineCoreOutput],
        abort: Callable[[str, tuple[int, ...] | None], object],
    ) -> list[RequestOutput]:
        """The one routine every driver (``Engine``, ``AsyncEngine``) applies a step's outputs
        with: :meth:`process` them, then tell the core through ``abort(request_id, indices)``
        which outputs a stop string ended (``indices``) and which requests failed here
        (``None``: the whole request)."""
        processed = self.process(core_outputs)
        for request_id, indices in processed.stopped:
            abort(request_id, indices)
        for request_id in processed.failed:
            abort(request_id, None)
        return processed.outputs

    def process(self, core_outputs: Iterable[EngineCoreOutput]) -> ProcessedOutputs:
        """Each request's new tokens to text. A request whose output cannot be processed
        (a detokenizer or stop-string fault) fails alone: an error output, listed in
        ``failed``; the others go on."""
        outputs: list[RequestOutput] = []
        stopped: list[tuple[str, tuple[int, ...]]] = []
        failed: list[str] = []
        for core_output in core_outputs:
            state = self._requests.get(core_output.request_id)
            if state is None:
                continue  # finished here already (a stop string); the core is catching up
            if core_output.error is not None:
                outputs.append(
                    self.fail(
                        core_output.request_id,
                        core_output.error,
                        is_request_fault=core_output.is_request_fault,
                    )
                )
                continue
            try:
                output = self._process_one(state, core_output, stopped)
            except Exception as error:
                logger.exception("request %s: its output cannot be processed", state.request_id)
                outputs.append(
                    self.fail(state.request_id, f"its output cannot be processed: {error}")
                )
                failed.append(state.request_id)
                continue
            if output is not None:
                outputs.append(output)
        return ProcessedOutputs(outputs=outputs, stopped=stopped, failed=failed)

    def _process_one(
        self,
        state: RequestState,
        core_output: EngineCoreOutput,
        stopped: list[tuple[str, tuple[int, ...]]],
    ) -> RequestOutput | None:
        state.num_cached_tokens = max(state.num_cached_tokens, core_output.num_cached_tokens)
        if core_output.prompt_logprobs is not None:
            state.prompt_logprobs = core_output.prompt_logprobs
        if core_output.pooled is not None:
            state.pooled = core_output.pooled
        newly_stopped = [delta.index for delta in core_output.deltas if self._apply(state, delta)]
        if newly_stopped and not state.is_finished:
            stopped.append((state.request_id, tuple(newly_stopped)))
        if state.is_finished:
            if not core_output.finished:
                stopped.append((state.request_id, tuple(range(len(state.texts)))))
            del self._requests[state.request_id]
        return _report(state)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Finish the request's unfinished outputs with ``abort``; ``None`` if unknown."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return None
        for text in state.texts:
            text.finish("abort")
        return _report(state)

    def fail(
        self, request_id: str, message: str, *, is_request_fault: bool = False
    ) -> RequestOutput:
        state = self._requests.pop(request_id, None)
        return RequestOutput(
            request_id=request_id,
            prompt=None if state is None else state.prompt,
            prompt_token_ids=() if state is None else state.prompt_token_ids,
            outputs=(),
            finished=True,
            error=message,
            is_request_fault=is_request_fault,
        )

    def _apply(self, state: RequestState, delta: SequenceDelta) -> bool:
        """Apply one output's new tokens; whether a stop string finished it just now."""
        text = state.texts[delta.index]
        if text.is_finished:
            return False
        params = state.params
        for position, token_id in enumerate(delta.new_token_ids):
            if delta.new_logprobs is not None:
                text.add_logprob(delta.new_logprobs[position])
            is_special_stop = token_id in params.stop_token_ids or (
                not params.ignore_eos and token_id in self._eos_token_ids
            )
            if text.add_token(
                token_id,
                render=not is_special_stop,
                check_stop_strings=len(text.token_ids) + 1 >= params.min_tokens,
            ):
                return True
        if delta.finish_reason is not None:
            text.finish(delta.finish_reason, delta.stop_token_id)
        return False


def _report(state: RequestState) -> RequestOutput | None:
    is_finished = state.is_finished
    if state.kind is RequestOutputKind.FINAL_ONLY and not is_finished:
        return None
    cumulative = is_finished or state.kind is RequestOutputKind.CUMULATIVE
    outputs = tuple(
        text.report(index, cumulative=cumulative) for index, text in enumerate(state.texts)
    )
    return RequestOutput(
        request_id=state.request_id,
        prompt=state.prompt,
        prompt_token_ids=state.prompt_token_ids,
        outputs=outputs,
        finished=is_finished,
        num_cached_tokens=state.num_cached_tokens,
        prompt_logprobs=state.prompt_logprobs,
        pooled=state.pooled,
    )
