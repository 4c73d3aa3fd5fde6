from __future__ import annotations

from metrale_kernels import build_attention_metadata
from metrale_kernels.cuda.attention_rows import SPLIT_KEYS, attention_rows


def test_rows_carry_each_tokens_sequence_and_position() -> None:
    metadata = build_attention_metadata(
        block_tables=[[0, 1], [2], [3, 4, 5]],
        seq_lens=[20, 5, 40],
        query_lens=[1, 3, 2],
        block_size=16,
    )
    rows = attention_rows(metadata, None)
    assert rows.row_seq.tolist() == [0, 1, 1, 1, 2, 2]
    assert rows.row_pos.tolist() == [19, 2, 3, 4, 38, 39]
    assert rows.max_splits == 1
    assert attention_rows(metadata, None) is rows


def test_splits_follow_the_longest_visible_context() -> None:
    long_len = 3 * SPLIT_KEYS + 1
    metadata = build_attention_metadata(
        block_tables=[list(range(long_len // 16 + 1)), [0]],
        seq_lens=[long_len, 3],
        query_lens=[1, 3],
        block_size=16,
    )
    assert attention_rows(metadata, None).max_splits == 4
    assert attention_rows(metadata, SPLIT_KEYS).max_splits == 1
    assert attention_rows(metadata, SPLIT_KEYS + 1).max_splits == 2
