"""DSA indexer and sparse latent attention against naive float64 loops.

The selection reference builds each query's position set from the rule as written; the
attention test puts NaN in every cache slot that no query selects and in every slot outside
the sequence's blocks, so reading any of them poisons the output.
"""

from __future__ import annotations

import math

import pytest
import torch

from metrale_kernels import (
    TorchBackend,
    index_scores,
    pool_index_keys,
    select_positions,
    sparse_latent_attention,
)


def naive_pool_index_keys(keys: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
    num_pools, pool_size, dim = keys.shape
    out = torch.zeros(num_pools, dim, dtype=torch.float64)
    for j in range(num_pools):
        for c in range(dim):
            weights = [math.exp(float(gate_logits[j, i, c])) for i in range(pool_size)]
            total = sum(weights)
            out[j, c] = sum(w / total * float(keys[j, i, c]) for i, w in enumerate(weights))
    return out


def naive_index_scores(
    index_q: torch.Tensor, head_weights: torch.Tensor, pooled_keys: torch.Tensor, scale: float
) -> torch.Tensor:
    num_queries, num_heads, _ = index_q.shape
    out = torch.zeros(num_queries, pooled_keys.shape[0], dtype=torch.float64)
    for t in range(num_queries):
        for j in range(pooled_keys.shape[0]):
            for h in range(num_heads):
                dot = float(index_q[t, h].double() @ pooled_keys[j].double())
                out[t, j] += float(head_weights[t, h]) * max(0.0, scale * dot)
    return out


def naive_selection(
    scores: torch.Tensor, position: int, *, kpool: int, topk_pools: int, select_tail: bool
) -> set[int]:
    """One query's set, from the rule: complete pools are candidates, the best ones win."""
    complete = (position + 1) // kpool
    candidates = sorted(range(complete), key=lambda j: -float(scores[j]))
    chosen: set[int] = set()
    for j in candidates[:topk_pools]:
        chosen |= set(range(j * kpool, (j + 1) * kpool))
    if select_tail and kpool > 1:
        chosen |= set(range(complete * kpool, position + 1))
    return chosen


def row_set(row: torch.Tensor) -> set[int]:
    """A row's positions, checking there are no duplicates."""
    values = [int(p) for p in row if p >= 0]
    assert len(values) == len(set(values))
    return set(values)


def test_pool_index_keys_matches_naive() -> None:
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(5, 4, 8, generator=generator).bfloat16()
    gate_logits = torch.randn(5, 4, 8, generator=generator) * 3
    out = TorchBackend().pool_index_keys(keys, gate_logits)
    assert out.dtype == torch.float32
    assert out.shape == (5, 8)
    torch.testing.assert_close(
        out.double(), naive_pool_index_keys(keys, gate_logits), rtol=1e-6, atol=1e-6
    )


def test_index_scores_matches_naive() -> None:
    generator = torch.Generator().manual_seed(1)
    num_heads, dim = 3, 8
    index_q = torch.randn(6, num_heads, dim, generator=generator)
    head_weights = torch.randn(6, num_heads, generator=generator) * num_heads**-0.5
    pooled_keys = torch.randn(5, dim, generator=generator)
    out = TorchBackend().index_scores(index_q, head_weights, pooled_keys, dim**-0.5)
    expected = naive_index_scores(index_q, head_weights, pooled_keys, dim**-0.5)
    assert out.dtype == torch.float32
    # Some heads' relu'd terms are positive, some head weights negative.
    assert (expected > 0).any()
    assert (expected < 0).any()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


# (kpool, topk_pools, select_tail, positions): a whole prefill, a continued one, single
# decode queries, P = 1, tail off, topk >= every query's pool count.
SELECTION_CASES = [
    (4, 2, True, list(range(30))),
    (4, 3, True, list(range(17, 33))),
    (4, 2, True, [3, 7, 31]),
    (4, 2, False, list(range(20))),
    (1, 5, True, list(range(12))),
    (1, 3, False, [0, 4, 9]),
    (5, 8, True, list(range(27))),
    (3, 1, True, [2, 5, 8, 10, 11]),
]


@pytest.mark.parametrize(("kpool", "topk_pools", "select_tail", "positions"), SELECTION_CASES)
def test_select_positions_matches_naive(
    kpool: int, topk_pools: int, select_tail: bool, positions: list[int]
) -> None:
    generator = torch.Generator().manual_seed(kpool * 100 + topk_pools)
    num_pools = (max(positions) + 1) // kpool + 2
    scores = torch.rand(len(positions), num_pools, generator=generator)
    complete = torch.tensor([(p + 1) // kpool for p in positions])
    # Pools a query may not choose score highest: they must be ignored anyway.
    scores[torch.arange(num_pools) >= complete[:, None]] = 1e9
    selected = TorchBackend().select_positions(
        scores,
        torch.tensor(positions),
        kpool=kpool,
        topk_pools=topk_pools,
        select_tail=select_tail,
    )
    assert selected.dtype == torch.int64
    assert selected.shape == (len(positions), topk_pools * kpool + max(kpool - 1, 0))
    for row, p, row_scores in zip(selected, positions, scores, strict=True):
        expected = naive_selection(
            row_scores, p, kpool=kpool, topk_pools=topk_pools, select_tail=select_tail
        )
        assert row_set(row) == expected, p
        assert max(expected, default=-1) <= p
        if select_tail and (p + 1) // kpool <= topk_pools:
            assert expected == set(range(p + 1))


def test_select_positions_completed_pool_may_not_select_itself() -> None:
    """Query 11 with P = 4 has three complete pools, its own the third: it selects itself only
    when that pool wins, and there is no tail."""
    scores = torch.tensor([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0]])
    selected = select_positions(
        scores, torch.tensor([11, 11]), kpool=4, topk_pools=2, select_tail=True
    )
    assert row_set(selected[0]) == set(range(8))
    assert row_set(selected[1]) == set(range(4, 12))


def test_select_positions_rejects_too_few_pools() -> None:
    with pytest.raises(ValueError, match="3 complete pools but scores cover 2"):
        select_positions(
            torch.zeros(1, 2), torch.tensor([11]), kpool=4, topk_pools=2, select_tail=True
        )


def make_cache(
    *, seed: int, seq_len: int, block_size: int, rank: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(latent_cache, block_table, latents (seq_len, rank))``: shuffled blocks, spare
    blocks and the last block's unused slots NaN."""
    generator = torch.Generator().manual_seed(seed)
    num_seq_blocks = -(-seq_len // block_size)
    num_blocks = num_seq_blocks + 3
    block_table = torch.randperm(num_blocks, generator=generator)[:num_seq_blocks]
    latents = torch.randn(seq_len, rank, generator=generator).to(dtype)
    cache = torch.full((num_blocks, block_size, rank), float("nan"), dtype=dtype)
    for p in range(seq_len):
        cache[block_table[p // block_size], p % block_size] = latents[p]
    return cache, block_table, latents


def naive_latent_attention(
    q: torch.Tensor, latents: torch.Tensor, selected: torch.Tensor, scale: float
) -> torch.Tensor:
    num_queries, num_heads, rank = q.shape
    out = torch.zeros(num_queries, num_heads, rank, dtype=torch.float64)
    for t in range(num_queries):
        chosen = [int(p) for p in selected[t] if p >= 0]
        for h in range(num_heads):
            logits = [scale * float(q[t, h].double() @ latents[p].double()) for p in chosen]
            top = max(logits, default=0.0)
            weights = [math.exp(x - top) for x in logits]
            for w, p in zip(weights, chosen, strict=True):
                out[t, h] += w / sum(weights) * latents[p].double()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_latent_attention_matches_naive(dtype: torch.dtype) -> None:
    seq_len, block_size, rank, num_heads = 23, 5, 16, 3
    cache, block_table, latents = make_cache(
        seed=2, seq_len=seq_len, block_size=block_size, rank=rank, dtype=dtype
    )
    generator = torch.Generator().manual_seed(3)
    positions = torch.tensor([0, 1, 2, 6, 11, 15, 19, 22])
    scores = torch.rand(len(positions), seq_len // 4, generator=generator)
    # Tail off: queries 0-2 have no complete pool and select nothing.
    selected = select_positions(scores, positions, kpool=4, topk_pools=2, select_tail=False)
    assert (selected[:3] == -1).all()
    # Every slot of the sequence that no query selects is NaN too.
    chosen = set(selected[selected >= 0].tolist())
    for p in set(range(seq_len)) - chosen:
        cache[block_table[p // block_size], p % block_size] = float("nan")
    q = torch.randn(len(positions), num_heads, rank, generator=generator).to(dtype)
    scale = 0.3
    out = TorchBackend().sparse_latent_attention(q, cache, block_table, selected, scale)
    assert out.dtype == dtype
    assert out.shape == q.shape
    expected = naive_latent_attention(q, latents, selected, scale)
    assert (out[:3] == 0).all()
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)


def test_sparse_latent_attention_many_rows_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows processed a few at a time give the same result as all at once."""
    from metrale_kernels.reference import dsa

    cache, block_table, latents = make_cache(
        seed=4, seq_len=40, block_size=16, rank=8, dtype=torch.float32
    )
    generator = torch.Generator().manual_seed(5)
    positions = torch.arange(40)
    scores = torch.rand(40, 10, generator=generator)
    selected = select_positions(scores, positions, kpool=4, topk_pools=3, select_tail=True)
    q = torch.randn(40, 2, 8, generator=generator)
    monkeypatch.setattr(dsa, "_BLOCK_ELEMENTS", 3 * selected.shape[1] * 8)
    out = sparse_latent_attention(q, cache, block_table, selected, 0.5)
    expected = naive_latent_attention(q, latents, selected, 0.5)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    index_q = torch.randn(40, 2, 8, generator=generator)
    head_weights = torch.randn(40, 2, generator=generator)
    pooled = torch.randn(10, 8, generator=generator)
    monkeypatch.setattr(dsa, "_BLOCK_ELEMENTS", 7 * 2 * 10)
    torch.testing.assert_close(
        index_scores(index_q, head_weights, pooled, 0.25).double(),
        naive_index_scores(index_q, head_weights, pooled, 0.25),
        rtol=1e-5,
        atol=1e-5,
    )


def test_pool_index_keys_extreme_logits() -> None:
    """Large gate logits: the softmax stays finite and picks the largest."""
    keys = torch.arange(8.0).view(1, 4, 2)
    gate_logits = torch.tensor([[[0.0, 500.0], [0.0, 0.0], [900.0, 0.0], [0.0, 0.0]]])
    out = pool_index_keys(keys, gate_logits)
    torch.testing.assert_close(out, torch.tensor([[4.0, 1.0]]))
