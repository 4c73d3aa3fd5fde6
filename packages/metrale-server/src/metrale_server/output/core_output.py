"""What the engine core emits per request and step: token ids and logprobs, never text."""

from __future__ import annotations

import attrs

from metrale_server.output.outputs import TokenLogprob


@attrs.frozen(kw_only=True, slots=True)
class SequenceDelta:
    """The tokens one output (``index`` of the request's ``n``) gained in a step.

    ``finish_reason`` is set when the core finished it: ``stop`` (an EOS or stop token;
    ``stop_token_id`` says which stop token), ``length`` or ``abort``.
    """

    index: int
    new_token_ids: tuple[int, ...]
    new_logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: str | None = None
    stop_token_id: int | None = None


@attrs.frozen(kw_only=True, slots=True)
class EngineCoreOutput:
    """A request's news from one step; ``finished`` once every output has finished.
    ``error``: why the request failed; ``is_request_fault`` when its own input caused it (a
    grammar too complex for the grammar engine), so the message is fit for the client.
    ``prompt_logprobs``: sent once, in the step that finished the prompt (``None`` first).
    ``pooled``: a pooling request's vector, with its finish."""

    request_id: str
    deltas: tuple[SequenceDelta, ...]
    finished: bool
    num_cached_tokens: int = 0
    error: str | None = None
    is_request_fault: bool = False
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    pooled: tuple[float, ...] | None = None
