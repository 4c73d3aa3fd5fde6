"""Bitmask allocation, unpacking, and the sampler's grammar stage against a per-token loop."""

from __future__ import annotations

import pytest
import torch

from metrale_server.structured import (
    allocate_bitmask,
    apply_bitmask_,
    bitmask_words,
    unpack_bitmask,
)

from .helpers import ids_in_row


def random_bitmask(num_rows: int, words: int, generator: torch.Generator) -> torch.Tensor:
    bitmask = torch.randint(-(2**31), 2**31, (num_rows, words), generator=generator)
    bitmask = bitmask.to(torch.int32)
    bitmask[0, 0] = -(2**31)  # bit 31 alone: the sign bit
    if num_rows > 1:
        bitmask[1] = 0  # a row that forbids everything
    return bitmask


def reference_apply(
    logits: torch.Tensor, bitmask: torch.Tensor, row_indices: list[int]
) -> torch.Tensor:
    expected = logits.clone()
    for k, row in enumerate(row_indices):
        for token in range(logits.shape[1]):
            word = int(bitmask[k, token // 32]) & 0xFFFFFFFF
            if not (word >> (token % 32)) & 1:
                expected[row, token] = float("-inf")
    return expected


@pytest.mark.parametrize(
    ("width", "words"),
    [(1, 1), (31, 1), (32, 1), (33, 2), (100, 4), (100, 7), (1000, 32), (1000, 40)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_bitmask_matches_a_per_token_loop(width: int, words: int, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(width * 100 + words)
    logits = torch.randn(6, width, generator=generator).to(dtype)
    row_indices = [4, 1, 0, 5]
    # Rows past len(row_indices) are ignored; words past the logits' width too.
    bitmask = random_bitmask(len(row_indices) + 2, words, generator)
    expected = reference_apply(logits, bitmask, row_indices)
    apply_bitmask_(logits, bitmask, torch.tensor(row_indices))
    assert torch.equal(logits, expected)
    assert torch.isinf(logits[1]).all()  # bitmask row 1 forbids everything
    assert torch.equal(logits[[2, 3]], expected[[2, 3]])  # unconstrained rows untouched


def test_no_rows_to_mask_changes_nothing() -> None:
    logits = torch.randn(3, 40)
    before = logits.clone()
    apply_bitmask_(logits, torch.zeros(0, 2, dtype=torch.int32), torch.zeros(0, dtype=torch.int64))
    assert torch.equal(logits, before)


def test_a_bitmask_too_narrow_or_short_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 64 tokens"):
        apply_bitmask_(torch.zeros(1, 65), allocate_bitmask(1, 64), torch.tensor([0]))
    with pytest.raises(ValueError, match="bitmask has 1"):
        apply_bitmask_(torch.zeros(3, 64), allocate_bitmask(1, 64), torch.tensor([0, 2]))


@pytest.mark.parametrize("width", [1, 33, 4099])
def test_unpack_reads_every_bit(width: int) -> None:
    generator = torch.Generator().manual_seed(width)
    bitmask = random_bitmask(3, bitmask_words(width), generator)
    unpacked = unpack_bitmask(bitmask, width)
    assert unpacked.shape == (3, width)
    assert unpacked.dtype == torch.bool
    for row in range(3):
        expected = {t for t in ids_in_row(bitmask[row]) if t < width}
        assert set(unpacked[row].nonzero().flatten().tolist()) == expected


def test_a_fresh_bitmask_allows_everything() -> None:
    bitmask = allocate_bitmask(2, 70)
    assert bitmask.shape == (2, 3)
    assert bitmask.dtype == torch.int32
    assert bitmask.device.type == "cpu"
    assert bool(unpack_bitmask(bitmask, 70).all())
    assert [bitmask_words(n) for n in (1, 32, 33, 49152, 49153)] == [1, 1, 2, 1536, 1537]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_apply_bitmask_on_cuda_matches_cpu() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 49_216, generator=generator, dtype=torch.float32)
    bitmask = random_bitmask(5, bitmask_words(49_216), generator)
    row_indices = torch.tensor([7, 0, 3, 2, 6])
    on_cpu = logits.clone()
    apply_bitmask_(on_cpu, bitmask, row_indices)
    on_cuda = logits.to("cuda", dtype=torch.bfloat16)
    apply_bitmask_(on_cuda, bitmask, row_indices)  # CPU bitmask and indices, CUDA logits
    assert torch.equal(torch.isinf(on_cuda.cpu()), torch.isinf(on_cpu))
