"""Attention sinks (gpt-oss) in the row-invariant torch attention: one more logit per head in
each row's softmax, its probability dropped."""

from __future__ import annotations

import pytest
import torch

from metrale_kernels.reference.row_invariant_attention import row_invariant_attention
from metrale_kernels.testing.paged_batches import PagedBatch, paged_batch

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 6, 2, 8
SCALE = HEAD_DIM**-0.5


def batch(seed: int = 0) -> PagedBatch:
    return paged_batch(
        seq_lens=[1, 9, 23, 17],
        query_lens=[1, 9, 5, 1],
        num_heads=NUM_HEADS,
        num_kv_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        dtype=torch.float32,
        device=torch.device("cpu"),
        block_size=4,
        seed=seed,
    )


def with_sinks_in_float64(
    batch: PagedBatch, sinks: torch.Tensor, sliding_window: int | None
) -> torch.Tensor:
    """Each query row over its sequence's unpaged keys, the sink appended to each head's scores."""
    metadata, group = batch.metadata, NUM_HEADS // NUM_KV_HEADS
    outputs, start = [], 0
    for seq, (query_len, seq_len) in enumerate(
        zip(metadata.query_lens, metadata.seq_lens, strict=True)
    ):
        table = metadata.block_tables[seq, : -(-seq_len // metadata.block_size)]
        keys = batch.k_cache[table].flatten(0, 1)[:seq_len].double().repeat_interleave(group, 1)
        values = batch.v_cache[table].flatten(0, 1)[:seq_len].double().repeat_interleave(group, 1)
        query = batch.q[start : start + query_len].double()
        start += query_len
        query_pos = torch.arange(seq_len - query_len, seq_len)[:, None]
        key_pos = torch.arange(seq_len)[None, :]
        visible = key_pos <= query_pos
        if sliding_window is not None:
            visible &= key_pos > query_pos - sliding_window
        # (heads, queries, keys)
        scores = torch.einsum("qhd,khd->hqk", query, keys) * SCALE
        scores = scores.masked_fill(~visible, float("-inf"))
        sink = sinks.double()[:, None, None].expand(-1, query_len, 1)
        probs = torch.cat((scores, sink), -1).softmax(-1)[..., :-1]
        outputs.append(torch.einsum("hqk,khd->qhd", probs, values))
    return torch.cat(outputs)


@pytest.mark.parametrize("sliding_window", [None, 5])
def test_sinks_join_each_heads_softmax(sliding_window: int | None) -> None:
    paged = batch()
    sinks = torch.linspace(-2.0, 3.0, NUM_HEADS)
    out = row_invariant_attention(
        paged.q, paged.k_cache, paged.v_cache, paged.metadata, SCALE, sliding_window, sinks=sinks
    )
    expected = with_sinks_in_float64(paged, sinks, sliding_window)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    plain = row_invariant_attention(
        paged.q, paged.k_cache, paged.v_cache, paged.metadata, SCALE, sliding_window
    )
    # A sink takes a share of every row: the weights no longer sum to one.
    assert (out - plain).abs().max() > 0.1


def test_a_sink_of_minus_infinity_is_plain_attention() -> None:
    paged = batch(seed=1)
    sinks = torch.full((NUM_HEADS,), float("-inf"))
    out = row_invariant_attention(
        paged.q, paged.k_cache, paged.v_cache, paged.metadata, SCALE, sinks=sinks
    )
    plain = row_invariant_attention(paged.q, paged.k_cache, paged.v_cache, paged.metadata, SCALE)
    torch.testing.assert_close(out, plain, atol=1e-6, rtol=1e-6)
