"""``CompiledGrammar`` and ``GrammarMatcher``: one grammar, and one output's place in it.

End of sequence: the tokenizer's EOS tokens are allowed exactly when the output so far is a
complete match of the grammar (``is_stop_allowed``). Accepting one ends the output
(``is_terminated``); so does reaching a point where the grammar allows nothing more (a choice
fully written, a regex with nothing left to match), before any EOS is sampled. A terminated
matcher allows EOS only, and accepts nothing but EOS.

EOS tokens never reach llguidance: the matcher counts them itself (llguidance ignores an EOS
after its own stop, which would make ``rollback`` counts disagree).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence

import attrs
import llguidance
import torch

from metrale_server.structured.bitmask import BITS_PER_WORD, bitmask_words

# From this many rows, one call fills them all on llguidance's thread pool without the GIL. On
# 2 CPUs a pool costs more than it saves at 2-4 rows and breaks even from 8 (a row is ~10-40 us).
PARALLEL_FILL_ROWS = 8


def _token_set(token_ids: Iterable[int]) -> frozenset[int]:
    return frozenset(token_ids)


@attrs.frozen(kw_only=True, eq=False)
class CompiledGrammar:
    """A grammar built once over one vocabulary; ``matcher()`` starts an output at its
    beginning. Immutable, and shared by every request that asks for the same constraint."""

    _prototype: llguidance.LLMatcher = attrs.field(repr=False)
    vocab_size: int
    eos_token_ids: frozenset[int] = attrs.field(converter=_token_set)
    compile_seconds: float = 0.0
    eos_row: torch.Tensor = attrs.field(
        init=False,
        repr=False,
        default=attrs.Factory(
            lambda self: _eos_only_row(self.eos_token_ids, self.vocab_size), takes_self=True
        ),
    )
    """The bitmask row that allows the EOS tokens only."""

    def matcher(self) -> GrammarMatcher:
        """A new matcher at the grammar's start (a copy of the compiled state; any thread)."""
        return GrammarMatcher(self._prototype.deep_copy(), self)


@attrs.define(eq=False)
class GrammarMatcher:
    """Which tokens one output may take next, advanced one accepted token at a time.

    Not thread-safe: one output's matcher is used by one thread at a time.
    """

    _matcher: llguidance.LLMatcher = attrs.field(repr=False)
    grammar: CompiledGrammar = attrs.field(repr=False)
    _num_tokens: int = attrs.field(default=0, init=False)  # accepted tokens, EOS included
    # Trailing accepted EOS tokens, never given to llguidance.
    _num_eos: int = attrs.field(default=0, init=False)

    @property
    def num_accepted_tokens(self) -> int:
        """Tokens accepted so far (EOS included): the most ``rollback`` can undo."""
        return self._num_tokens

    def accept_token(self, token_id: int) -> bool:
        """Advance past ``token_id`` if the grammar allows it there; otherwise return ``False``
        and leave the matcher as it was."""
        if token_id in self.grammar.eos_token_ids:
            # After an internal grammar error the mask allows EOS only: let the output end.
            if not (self.is_stop_allowed or self._matcher.is_error()):
                return False
            self._num_eos += 1
        elif (
            self._num_eos
            or not 0 <= token_id < self.grammar.vocab_size
            or self._matcher.try_consume_tokens([token_id]) != 1
        ):
            return False
        self._num_tokens += 1
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into ``bitmask[row]``: bit ``t % 32`` of int32 word
        ``t // 32`` is set when token ``t`` is allowed. ``bitmask`` is a contiguous 2-D int32
        CPU tensor of ``ceil(vocab_size / 32)`` words a row (``allocate_bitmask``)."""
        _check_bitmask(bitmask, self.grammar.vocab_size, row + 1)
        if self._is_eos_only():
            bitmask[row].copy_(self.grammar.eos_row)
            return
        target = bitmask[row]
        self._matcher.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * 4)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (rejected speculative tokens);
        ``ValueError`` beyond ``num_accepted_tokens``."""
        if not 0 <= num_tokens <= self._num_tokens:
            raise ValueError(
                f"cannot roll back {num_tokens} tokens: {self._num_tokens} were accepted"
            )
        eos = min(num_tokens, self._num_eos)
        self._num_eos -= eos
        if num_tokens > eos and not self._matcher.rollback(num_tokens - eos):
            raise ValueError(f"cannot roll back {num_tokens} tokens: {self._matcher.get_error()}")
        self._num_tokens -= num_tokens

    @property
    def is_terminated(self) -> bool:
        """Whether the output is complete: an EOS was accepted, or the grammar allows nothing
        but EOS (also true after an internal grammar error, see ``error``)."""
        return self._num_eos > 0 or bool(self._matcher.is_stopped())

    @property
    def is_stop_allowed(self) -> bool:
        """Whether EOS may come next: the output so far is a complete match of the grammar."""
        return bool(self._matcher.is_accepting())

    @property
    def error(self) -> str | None:
        """The grammar engine's error (a resource limit hit mid-output), ``None`` normally."""
        return self._matcher.get_error() if self._matcher.is_error() else None

    def _is_eos_only(self) -> bool:
        return self._num_eos > 0 or bool(self._matcher.is_error())


def fill_bitmasks(matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor) -> None:
    """``matchers[k].fill_bitmask(bitmask, k)`` for every ``k``, the rows computed in parallel
    without the GIL when there are several. All matchers share one vocabulary size."""
    if not matchers:
        return
    vocab_size = matchers[0].grammar.vocab_size
    if any(matcher.grammar.vocab_size != vocab_size for matcher in matchers):
        raise ValueError("fill_bitmasks: the matchers have different vocabulary sizes")
    _check_bitmask(bitmask, vocab_size, len(matchers))
    parallel = []
    for row, matcher in enumerate(matchers):
        if len(matchers) < PARALLEL_FILL_ROWS or matcher._is_eos_only():
            matcher.fill_bitmask(bitmask, row)
        else:
            parallel.append((matcher._matcher, row))
    if parallel:
        _executor().unsafe_compute_mask_ptr(
            parallel, bitmask.data_ptr(), bitmask.shape[1] * 4, bitmask.shape[0]
        )


def _check_bitmask(bitmask: torch.Tensor, vocab_size: int, num_rows: int) -> None:
    # llguidance writes through a raw pointer: the layout must be exactly this.
    words = bitmask_words(vocab_size)
    if not (
        bitmask.dtype == torch.int32
        and bitmask.device.type == "cpu"
        and bitmask.dim() == 2
        and bitmask.is_contiguous()
        and bitmask.shape[1] == words
        and bitmask.shape[0] >= num_rows
    ):
        raise ValueError(
            f"a grammar bitmask must be a contiguous int32 CPU tensor of at least {num_rows} "
            f"rows of {words} words, got {bitmask.dtype} {tuple(bitmask.shape)} on "
            f"{bitmask.device}"
        )


def _eos_only_row(eos_token_ids: Iterable[int], vocab_size: int) -> torch.Tensor:
    words = [0] * bitmask_words(vocab_size)
    for token_id in eos_token_ids:
        words[token_id // BITS_PER_WORD] |= 1 << (token_id % BITS_PER_WORD)
    # As signed int32: bit 31 set is a negative word.
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


@functools.cache
def _executor() -> llguidance.LLExecutor:
    # One thread per CPU this process may run on (llguidance's default takes 80% of them).
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return llguidance.LLExecutor(num_threads=cpus or 1)
