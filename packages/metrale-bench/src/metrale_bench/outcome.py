"""``RequestOutcome``: one benchmark request as the client saw it."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class RequestOutcome:
    """The timings and token counts of one streamed request, in seconds.

    ``start_s`` is when the request was sent (after any wait for a concurrency slot), measured
    from the start of the run. ``ttft_s`` runs from sending to the first chunk carrying text;
    ``itl_s`` holds the gaps between successive text-carrying chunks (per chunk, not per token);
    ``latency_s`` runs from sending to the last chunk with choices (for a failed request: to
    the moment it failed). Token counts are the server's ``usage`` figures. A failed request
    says why in ``error``; a successful one has ``error is None`` and ``ttft_s`` set.
    """

    start_s: float
    latency_s: float
    ttft_s: float | None = None
    itl_s: tuple[float, ...] = ()
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def is_success(self) -> bool:
        return self.error is None

    @property
    def end_s(self) -> float:
        """When the request ended (its last chunk, or its failure), from the start of the run."""
        return self.start_s + self.latency_s
