"""Sliding-window layers' K/V in a ring per sequence instead of the paged KV pool.

A query at position ``q`` of a layer with window ``W`` reads the keys at ``q - W + 1 .. q``. A
step writes a sequence's chunk of at most ``C`` tokens before it attends, so the rows one step
reads for a sequence span ``W - 1 + C`` positions: a ring of at least that many rows, position
``p`` at row ``p mod ring_tokens``, never overwrites a row a query of the step reads. Drafts a
speculative step rejects sit past the kept tokens; what they overwrote lies more than ``W - 1``
before any later query, and the rows they hold are rewritten before a query reads them. The
ring is whole blocks, one more than that span needs, so it is also a small paged pool: slot
``s``'s logical block ``j`` is ring block ``s * ring_blocks + j mod ring_blocks``, and paged
attention (which masks by position) reads it unchanged.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from metrale_model_arch.cache_spec import LayerCacheSpec, SlidingWindowRingSpec, SlidingWindowSpec

# A ring model's prefill runs in chunks of at least this many tokens (when the step budget
# allows): narrower chunks starve the matmuls, wider ones grow every ring by their width.
MIN_RING_STEP_TOKENS = 512


class SlidingWindowCache(enum.StrEnum):
    """``--sliding-window-cache``: ``ring`` (each sequence holds its window, per slot) or
    ``full`` (every token in the KV pool, as full attention)."""

    RING = "ring"
    FULL = "full"

    @classmethod
    def parse(cls, name: str) -> SlidingWindowCache:
        try:
            return cls(name)
        except ValueError:
            choices = ", ".join(member.value for member in cls)
            raise ValueError(f"--sliding-window-cache {name!r}: choose one of {choices}") from None


def ring_step_tokens(sliding_window: int, max_batch_tokens: int) -> int:
    """The most tokens one sequence runs in a step beside a ring of ``sliding_window``: the
    window, at least ``MIN_RING_STEP_TOKENS``, never more than a step's ``max_batch_tokens``."""
    return min(max_batch_tokens, max(sliding_window, MIN_RING_STEP_TOKENS))


def ring_blocks(sliding_window: int, step_tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` a sequence's ring holds: ``sliding_window - 1 + step_tokens``
    tokens, rounded up, and one more block."""
    return -(-(sliding_window - 1 + step_tokens) // block_size) + 1


@attrs.frozen(kw_only=True)
class RingLayout:
    """The serve arguments a ring is sized by."""

    block_size: int
    max_batch_tokens: int
    max_seq_len: int

    def ring_spec(self, spec: SlidingWindowSpec) -> SlidingWindowRingSpec | None:
        """``spec`` held in a ring, or ``None`` where the ring would hold as many tokens as a
        ``max_seq_len`` sequence (then the KV pool costs no more)."""
        step_tokens = ring_step_tokens(spec.sliding_window, self.max_batch_tokens)
        blocks = ring_blocks(spec.sliding_window, step_tokens, self.block_size)
        if blocks * self.block_size >= self.max_seq_len:
            return None
        return SlidingWindowRingSpec(
            attention=spec, ring_blocks=blocks, block_size=self.block_size, step_tokens=step_tokens
        )


def ring_window_specs(
    specs: tuple[LayerCacheSpec, ...], layout: RingLayout
) -> tuple[LayerCacheSpec, ...]:
    """``specs`` with each sliding-window layer in a ring where that saves memory."""
    return tuple(
        (layout.ring_spec(spec) or spec) if isinstance(spec, SlidingWindowSpec) else spec
        for spec in specs
    )


def ring_specs_of(specs: Sequence[LayerCacheSpec]) -> tuple[SlidingWindowRingSpec, ...]:
    return tuple(spec for spec in specs if isinstance(spec, SlidingWindowRingSpec))


def ring_step_cap(specs: Sequence[LayerCacheSpec]) -> int | None:
    """The most tokens one sequence may run in a step so every ring holds it (``None``: no
    layer is in a ring)."""
    return min((spec.step_tokens for spec in ring_specs_of(specs)), default=None)
