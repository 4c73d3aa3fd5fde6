"""build_attention_metadata: hand-computed slots, padding, derived properties, every error."""

from __future__ import annotations

import pytest
import torch

from metrale_kernels import build_attention_metadata


def test_hand_computed_example() -> None:
    metadata = build_attention_metadata(
        block_tables=[[7, 2], [5], [0, 3, 9]],
        seq_lens=[6, 3, 10],
        query_lens=[6, 1, 3],
        block_size=4,
    )
    # seq 0, positions 0-5: block 7 holds 0-3 (slots 28-31), block 2 holds 4-5 (slots 8, 9).
    # seq 1, position 2: block 5, offset 2 -> 22.
    # seq 2, positions 7-9: block 3 offset 3 -> 15, then block 9 offsets 0, 1 -> 36, 37.
    assert metadata.slot_mapping.tolist() == [28, 29, 30, 31, 8, 9, 22, 15, 36, 37]
    assert metadata.query_start_loc.tolist() == [0, 6, 7, 10]
    assert metadata.seq_lens_tensor.tolist() == [6, 3, 10]
    assert metadata.block_tables.tolist() == [[7, 2, 0], [5, 0, 0], [0, 3, 9]]
    for tensor in (
        metadata.slot_mapping,
        metadata.query_start_loc,
        metadata.seq_lens_tensor,
        metadata.block_tables,
    ):
        assert tensor.dtype == torch.int64
    assert metadata.query_lens == (6, 1, 3)
    assert metadata.seq_lens == (6, 3, 10)
    assert metadata.block_size == 4
    assert metadata.num_seqs == 3
    assert metadata.num_tokens == 10
    assert metadata.max_query_len == 6
    assert metadata.max_seq_len == 10
    assert not metadata.is_decode_only


def test_decode_batch() -> None:
    metadata = build_attention_metadata(
        block_tables=[[4, 1], [3]], seq_lens=[5, 1], query_lens=[1, 1], block_size=3
    )
    # position 4 of seq 0: block 1, offset 1 -> 4; position 0 of seq 1: block 3 -> 9.
    assert metadata.slot_mapping.tolist() == [4, 9]
    assert metadata.query_start_loc.tolist() == [0, 1, 2]
    assert metadata.is_decode_only


def test_empty_batch() -> None:
    metadata = build_attention_metadata(block_tables=[], seq_lens=[], query_lens=[], block_size=16)
    assert metadata.slot_mapping.shape == (0,)
    assert metadata.query_start_loc.tolist() == [0]
    assert metadata.block_tables.shape == (0, 0)
    assert metadata.num_seqs == metadata.num_tokens == metadata.max_seq_len == 0


@pytest.mark.parametrize(
    ("block_tables", "seq_lens", "query_lens", "block_size", "message"),
    [
        ([[0]], [1, 2], [1], 4, "one entry per sequence"),
        ([[0], [1]], [1, 2], [1], 4, "one entry per sequence"),
        ([[0]], [3], [0], 4, "query_len 0 must be in 1..seq_len"),
        ([[0]], [3], [4], 4, "query_len 4 must be in 1..seq_len"),
        ([[0]], [5], [5], 4, "1 blocks of 4 cannot hold 5 tokens"),
        ([[0], []], [4, 1], [4, 1], 4, "0 blocks of 4 cannot hold 1 tokens"),
        ([[0]], [1], [1], 0, "block_size must be at least 1"),
    ],
)
def test_errors(
    block_tables: list[list[int]],
    seq_lens: list[int],
    query_lens: list[int],
    block_size: int,
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        build_attention_metadata(
            block_tables=block_tables,
            seq_lens=seq_lens,
            query_lens=query_lens,
            block_size=block_size,
        )


def test_state_slots_default_to_none() -> None:
    metadata = build_attention_metadata(
        block_tables=[[0]], seq_lens=[1], query_lens=[1], block_size=4
    )
    assert metadata.state_slots is None


@pytest.mark.parametrize("state_slots", [[3, 0], torch.tensor([3, 0], dtype=torch.int32)])
def test_state_slots_become_an_int64_tensor(state_slots: list[int] | torch.Tensor) -> None:
    metadata = build_attention_metadata(
        block_tables=[[0], [1]],
        seq_lens=[2, 1],
        query_lens=[2, 1],
        block_size=4,
        state_slots=state_slots,
    )
    assert metadata.state_slots is not None
    assert metadata.state_slots.dtype == torch.int64
    assert metadata.state_slots.tolist() == [3, 0]


def test_state_slots_need_one_entry_per_sequence() -> None:
    with pytest.raises(ValueError, match=r"state_slots must have one entry per sequence \(2\)"):
        build_attention_metadata(
            block_tables=[[0], [1]],
            seq_lens=[1, 1],
            query_lens=[1, 1],
            block_size=4,
            state_slots=[0],
        )
