"""What the engine returns for a request: per-output text, tokens, logprobs and finish reason."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class TokenLogprob:
    """One position's chosen token and the most likely alternatives (id, logprob), best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@attrs.frozen(kw_only=True)
class CompletionOutput:
    """One of a request's ``n`` outputs, cumulative so far.

    ``delta_text`` / ``delta_token_ids`` are what is new since this output was last reported.
    ``finish_reason`` is ``None`` while running, then ``stop``, ``length`` or ``abort``;
    ``stop_reason`` names the stop string or stop token id that ended it, if one did.
    """

    index: int
    text: str
    token_ids: tuple[int, ...]
    delta_text: str = ""
    delta_token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@attrs.frozen(kw_only=True)
class RequestOutput:
    """A request's state after an engine step; ``finished`` once every output has finished.

    ``error`` is set (and ``outputs`` empty) when the request was refused or failed.
    """

    request_id: str
    prompt: str | None = attrs.field(default=None, repr=False)
    prompt_token_ids: tuple[int, ...] = attrs.field(repr=False)
    outputs: tuple[CompletionOutput, ...]
    finished: bool
    num_cached_tokens: int = 0
    error: str | None = None
