"""The scheduler's output: what the model runs in one step. Small, and never prints tokens."""

from __future__ import annotations

import attrs

from metrale_server.engine.sequence import Sequence


@attrs.frozen(kw_only=True)
class ScheduledChunk:
    """Run ``num_new_tokens`` tokens of ``seq`` starting at position ``start``.

    ``samplers`` are the sequences that take a token sampled from the chunk's last position:
    empty for a prefill chunk that does not reach the end, ``(seq,)`` normally, and ``seq``
    plus its freshly forked siblings when an ``n > 1`` prompt completes. A decode chunk with
    ``num_draft_tokens`` also runs that many speculative tokens after the sequence's last one
    (``seq.draft_token_ids``): ``num_new_tokens`` counts them.
    """

    seq: Sequence
    start: int
    num_new_tokens: int
    samplers: tuple[Sequence, ...]
    num_draft_tokens: int = 0


@attrs.frozen(kw_only=True)
class SchedulerStep:
    chunks: tuple[ScheduledChunk, ...]
    # (src, dst) block pairs to copy before the forward pass (copy-on-write).
    block_copies: tuple[tuple[int, int], ...] = ()
    preempted_request_ids: tuple[str, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_new_tokens for chunk in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks
