"""Token bitmasks: allocation, and the sampler's stage that masks what a grammar forbids."""

from __future__ import annotations

import torch

BITS_PER_WORD = 32


def allocate_bitmask(num_rows: int, vocab_size: int) -> torch.Tensor:
    """An all-allowed int32 (num_rows, ceil(vocab_size / 32)) mask on the CPU."""
    return torch.full((num_rows, -(-vocab_size // BITS_PER_WORD)), -1, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(rows, vocab_size) bool: token ``t`` is allowed when bit ``t % 32`` of word ``t // 32``
    is set (an arithmetic shift keeps bit 31 of a negative word readable)."""
    shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1
    return bits.flatten(1)[:, :vocab_size].bool()


def apply_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor, row_indices: torch.Tensor) -> None:
    """``logits[row_indices[k], t] = -inf`` for every token ``t`` bitmask row ``k`` forbids."""
    allowed = unpack_bitmask(bitmask.to(logits.device, non_blocking=True), logits.shape[1])
    rows = logits.index_select(0, row_indices)
    rows.masked_fill_(~allowed, float("-inf"))
    logits.index_copy_(0, row_indices, rows)
