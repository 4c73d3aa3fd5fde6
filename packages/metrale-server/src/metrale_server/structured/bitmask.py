"""Token bitmasks: allocation, unpacking, and the sampler's stage that masks what a grammar
forbids.

A bitmask row is ``ceil(vocab_size / 32)`` int32 words; token ``t`` is allowed when bit
``t % 32`` of word ``t // 32`` is set (bit 31 is the sign bit of the word).
"""

from __future__ import annotations

import torch

BITS_PER_WORD = 32


def bitmask_words(vocab_size: int) -> int:
    """Words in one row of a bitmask over ``vocab_size`` tokens."""
    return -(-vocab_size // BITS_PER_WORD)


def allocate_bitmask(num_rows: int, vocab_size: int) -> torch.Tensor:
    """An all-allowed int32 ``(num_rows, ceil(vocab_size / 32))`` bitmask on the CPU."""
    return torch.full((num_rows, bitmask_words(vocab_size)), -1, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``(rows, vocab_size)`` bool, on the bitmask's device: ``True`` where a token is allowed.
    ``vocab_size`` must be at most ``32 * bitmask.shape[1]``."""
    if vocab_size > BITS_PER_WORD * bitmask.shape[1]:
        raise ValueError(
            f"a bitmask of {bitmask.shape[1]} words a row covers at most "
            f"{BITS_PER_WORD * bitmask.shape[1]} tokens, not {vocab_size}"
        )
    shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=bitmask.device)
    # An arithmetic shift keeps bit 31 of a negative word readable.
    bits = (bitmask[:, :, None] >> shifts) & 1
    return bits.flatten(1)[:, :vocab_size].bool()


def apply_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor, row_indices: torch.Tensor) -> None:
    """``logits[row_indices[k], t] = -inf`` for every token ``t`` whose bit is clear in
    ``bitmask[k]``, for ``k < len(row_indices)`` (further bitmask rows are ignored).

    ``logits`` is ``(rows, width)`` on any device and dtype, with ``width <= 32 *
    bitmask.shape[1]``; ``bitmask`` and ``row_indices`` (distinct rows) may be on any device.
    Vectorized: no Python loop over rows or tokens.
    """
    num_rows = row_indices.numel()
    if num_rows == 0:
        return
    if bitmask.shape[0] < num_rows:
        raise ValueError(f"{num_rows} rows to mask but the bitmask has {bitmask.shape[0]}")
    device = logits.device
    forbidden = ~unpack_bitmask(bitmask[:num_rows].to(device), logits.shape[1])
    row_indices = row_indices.to(device)
    rows = logits.index_select(0, row_indices)
    rows.masked_fill_(forbidden, float("-inf"))
    logits.index_copy_(0, row_indices, rows)
