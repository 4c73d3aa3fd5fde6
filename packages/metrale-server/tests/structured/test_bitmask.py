"""The sampler's grammar stage against a naive per-token reference."""

from __future__ import annotations

import pytest
import torch

from metrale_server.structured import allocate_bitmask, apply_bitmask_, unpack_bitmask


@pytest.mark.parametrize("vocab_size", [1, 31, 32, 33, 100, 4099])
def test_apply_bitmask_matches_a_per_token_loop(vocab_size: int) -> None:
    generator = torch.Generator().manual_seed(vocab_size)
    num_rows = 5
    logits = torch.randn(num_rows, vocab_size, generator=generator)
    row_indices = torch.tensor([3, 0, 4])
    bitmask = allocate_bitmask(len(row_indices), vocab_size)
    bitmask.copy_(torch.randint(-(2**31), 2**31 - 1, bitmask.shape, generator=generator))
    expected = logits.clone()
    for k, row in enumerate(row_indices.tolist()):
        for token in range(vocab_size):
            word = int(bitmask[k, token // 32]) & 0xFFFFFFFF
            if not (word >> (token % 32)) & 1:
                expected[row, token] = float("-inf")
    apply_bitmask_(logits, bitmask, row_indices)
    assert torch.equal(logits, expected)


def test_a_fresh_bitmask_allows_everything() -> None:
    assert bool(unpack_bitmask(allocate_bitmask(2, 70), 70).all())
    assert allocate_bitmask(2, 70).shape == (2, 3)
