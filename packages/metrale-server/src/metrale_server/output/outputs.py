"""What the engine returns for a request: per-output text, tokens, logprobs and finish reason."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class TokenLogprob:
    """One position's chosen token and the most likely alternatives (id, logprob), best first.
    ``rank``: the chosen token's place in the whole distribution (1: the most likely), where it
    was computed (prompt logprobs)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None


@attrs.frozen(kw_only=True)
class CompletionOutput:
    """One of a request's ``n`` outputs.

    ``delta_text`` / ``delta_token_ids`` / ``delta_logprobs`` are what is new since this output
    was last reported; ``num_tokens`` counts every token so far. ``text``, ``token_ids`` and
    ``logprobs`` are cumulative when ``is_cumulative`` — always in a finished output, and in
    every output of a request asked for with ``RequestOutputKind.CUMULATIVE``; a streamed
    (``DELTA``) request's unfinished outputs leave them empty, so no step copies a long
    output. ``logprobs`` / ``delta_logprobs`` are ``None`` when none were asked for.
    ``finish_reason`` is ``None`` while running, then ``stop``, ``length`` or ``abort``;
    ``stop_reason`` names the stop string or stop token id that ended it, if one did.
    """

    index: int
    text: str
    token_ids: tuple[int, ...]
    num_tokens: int = attrs.field()
    delta_text: str = ""
    delta_token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None
    delta_logprobs: tuple[TokenLogprob, ...] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    is_cumulative: bool = True

    @num_tokens.default
    def _num_tokens_default(self) -> int:
        return len(self.token_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@attrs.frozen(kw_only=True)
class RequestOutput:
    """A request's state after an engine step; ``finished`` once every output has finished.

    ``error`` is set (and ``outputs`` empty) when the request was refused or failed;
    ``is_request_fault`` when its own input caused the failure (the message may be shown).
    ``prompt_logprobs`` (asked with ``SamplingParams.prompt_logprobs``): one entry per prompt
    token, ``None`` for the first (nothing precedes it); set from the output that follows the
    prefill on. ``pooled``: a pooling request's vector (``SamplingParams.pooling``), in its
    finished output.
    """

    request_id: str
    prompt: str | None = attrs.field(default=None, repr=False)
    prompt_token_ids: tuple[int, ...] = attrs.field(repr=False)
    outputs: tuple[CompletionOutput, ...]
    finished: bool
    num_cached_tokens: int = 0
    error: str | None = None
    is_request_fault: bool = False
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = attrs.field(default=None, repr=False)
    pooled: tuple[float, ...] | None = attrs.field(default=None, repr=False)
