"""``CompiledGrammar`` and ``GrammarMatcher``: one grammar, and one output's place in it."""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import torch

# Masks of this many rows or more are filled by llguidance's own thread pool (without the GIL).
PARALLEL_FILL_ROWS = 4
_EXECUTOR: llguidance.LLExecutor | None = None


class CompiledGrammar:
    """A grammar built once; ``matcher()`` starts an output at its beginning (a cheap copy)."""

    def __init__(self, prototype: llguidance.LLMatcher, vocab_size: int) -> None:
        self._prototype = prototype
        self.vocab_size = vocab_size

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._prototype.deep_copy())


class GrammarMatcher:
    """Which tokens one output may take next, advanced one accepted token at a time.

    The end-of-sequence tokens are allowed exactly when the grammar may end; once nothing can
    follow (``is_terminated``) they are the only tokens allowed.
    """

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    @property
    def llguidance_matcher(self) -> llguidance.LLMatcher:
        return self._matcher

    def accept_token(self, token_id: int) -> bool:
        """Advance past ``token_id``; ``False`` if the grammar does not allow it (the matcher
        is then in an error state for good)."""
        return bool(self._matcher.consume_token(token_id)) and not self._matcher.is_error()

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (int32 words, bit ``t % 32`` of
        word ``t // 32`` for token ``t``; CPU, contiguous)."""
        _check_bitmask(bitmask)
        target = bitmask[row]
        self._matcher.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * 4)

    def rollback(self, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` accepted tokens (rejected speculative tokens)."""
        if not self._matcher.rollback(num_tokens):
            raise ValueError(f"cannot roll back {num_tokens} tokens: {self._matcher.get_error()}")

    @property
    def is_terminated(self) -> bool:
        """Whether the output is complete: nothing but end-of-sequence can follow."""
        return bool(self._matcher.is_stopped())

    @property
    def error(self) -> str | None:
        return self._matcher.get_error() if self._matcher.is_error() else None


def fill_bitmasks(matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor) -> None:
    """Rows ``0..len(matchers)-1`` of ``bitmask``, in parallel (GIL released) when there are
    several."""
    if len(matchers) < PARALLEL_FILL_ROWS:
        for row, matcher in enumerate(matchers):
            matcher.fill_bitmask(bitmask, row)
        return
    _check_bitmask(bitmask)
    if len(matchers) > bitmask.shape[0]:
        raise ValueError(f"{len(matchers)} matchers for a bitmask of {bitmask.shape[0]} rows")
    _executor().unsafe_compute_mask_ptr(
        [(matcher.llguidance_matcher, row) for row, matcher in enumerate(matchers)],
        bitmask.data_ptr(),
        bitmask.shape[1] * 4,
        bitmask.shape[0],
    )


def _check_bitmask(bitmask: torch.Tensor) -> None:
    # llguidance writes through a raw pointer: the layout must be exactly this.
    if not (
        bitmask.dtype == torch.int32
        and bitmask.device.type == "cpu"
        and bitmask.dim() == 2
        and bitmask.is_contiguous()
    ):
        raise ValueError("a grammar bitmask must be a contiguous 2-D int32 CPU tensor")


def _executor() -> llguidance.LLExecutor:
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = llguidance.LLExecutor()
    return _EXECUTOR
