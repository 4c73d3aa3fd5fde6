"""TorchBackend.paged_attention against dense masked-softmax attention on the unpaged K/V.

Every cache slot no sequence owns (spare blocks, the tail of a last block) holds NaN, and table
padding names either such a spare block or a block outside the pool: reading any of them
poisons the output or raises, so a passing test proves only the right slots were read.
The reference runs in float64, one head at a time.
"""

from __future__ import annotations

import math

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional

from metrale_kernels import AttentionMetadata, TorchBackend, build_attention_metadata
from metrale_kernels.reference import paged_attention as paged_attention_module

HEAD_DIM = 16
# (heads, kv_heads): group sizes 1, 3 and 4.
HEAD_LAYOUTS = [(4, 4), (6, 2), (8, 2)]
BLOCK_SIZES = [1, 5, 16]


@attrs.frozen(kw_only=True)
class PagedBatch:
    q: torch.Tensor  # (tokens, heads, head_dim)
    k_cache: torch.Tensor  # (num_blocks, block_size, kv_heads, head_dim)
    v_cache: torch.Tensor
    keys: list[torch.Tensor]  # per sequence: (seq_len, kv_heads, head_dim)
    values: list[torch.Tensor]
    metadata: AttentionMetadata


def make_batch(
    *,
    seed: int,
    seq_lens: list[int],
    query_lens: list[int],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    dtype: torch.dtype = torch.float32,
    num_spare_blocks: int = 3,
    head_dim: int = HEAD_DIM,
) -> PagedBatch:
    """A pool with shuffled block ids and NaN in every slot no sequence owns.

    Tables are padded past their context: even ones with NaN-filled spare blocks, odd ones
    with an id outside the pool.
    """
    generator = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + num_spare_blocks
    block_ids = torch.randperm(num_blocks, generator=generator).tolist()
    spare_ids = block_ids[sum(blocks_per_seq) :]
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    v_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    tables: list[list[int]] = []
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    used = 0
    for seq_len, num_seq_blocks in zip(seq_lens, blocks_per_seq, strict=True):
        table = block_ids[used : used + num_seq_blocks]
        used += num_seq_blocks
        seq_keys = torch.randn(seq_len, num_kv_heads, head_dim, generator=generator).to(dtype)
        seq_values = torch.randn(seq_len, num_kv_heads, head_dim, generator=generator).to(dtype)
        for position in range(seq_len):
            block, offset = table[position // block_size], position % block_size
            k_cache[block, offset] = seq_keys[position]
            v_cache[block, offset] = seq_values[position]
        padding = spare_ids[:2] if len(tables) % 2 == 0 else [num_blocks + 1000]
        tables.append(table + padding)
        keys.append(seq_keys)
        values.append(seq_values)
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=generator).to(dtype)
    metadata = build_attention_metadata(
        block_tables=tables, seq_lens=seq_lens, query_lens=query_lens, block_size=block_size
    )
    return PagedBatch(
        q=q, k_cache=k_cache, v_cache=v_cache, keys=keys, values=values, metadata=metadata
    )


def dense_attention(
    batch: PagedBatch, scale: float, sliding_window: int | None = None
) -> torch.Tensor:
    """Softmax attention per sequence and head over the unpaged K/V, in float64."""
    num_heads, num_kv_heads = batch.q.shape[1], batch.k_cache.shape[2]
    group = num_heads // num_kv_heads
    outputs = []
    start = 0
    for seq_keys, seq_values, query_len in zip(
        batch.keys, batch.values, batch.metadata.query_lens, strict=True
    ):
        seq_len = seq_keys.shape[0]
        query = batch.q[start : start + query_len].double()
        start += query_len
        query_pos = torch.arange(seq_len - query_len, seq_len)[:, None]
        key_pos = torch.arange(seq_len)[None, :]
        allowed = key_pos <= query_pos
        if sliding_window is not None:
            allowed = allowed & (key_pos > query_pos - sliding_window)
        heads = []
        for head in range(num_heads):
            head_keys = seq_keys[:, head // group].double()
            head_values = seq_values[:, head // group].double()
            scores = (query[:, head] @ head_keys.T) * scale
            scores = scores.masked_fill(~allowed, float("-inf"))
            heads.append(torch.softmax(scores, dim=-1) @ head_values)
        outputs.append(torch.stack(heads, dim=1))
    return torch.cat(outputs)


def check(batch: PagedBatch, sliding_window: int | None = None, *, atol: float = 1e-5) -> None:
    scale = HEAD_DIM**-0.5
    out = TorchBackend().paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.metadata, scale, sliding_window
    )
    assert out.shape == batch.q.shape
    assert out.dtype == batch.q.dtype
    expected = dense_attention(batch, scale, sliding_window)
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=atol)
    # The gathering reference (the torch path on CUDA) against the same dense attention.
    gathered = paged_attention_module.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.metadata, scale, sliding_window
    )
    torch.testing.assert_close(gathered.double(), expected, atol=atol, rtol=atol)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEAD_LAYOUTS)
def test_ragged_prefill(seed: int, block_size: int, num_heads: int, num_kv_heads: int) -> None:
    seq_lens = [5, 16, 33, 2]
    batch = make_batch(
        seed=seed,
        seq_lens=seq_lens,
        query_lens=seq_lens,
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
    )
    check(batch)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEAD_LAYOUTS)
def test_cached_prefix(seed: int, block_size: int, num_heads: int, num_kv_heads: int) -> None:
    batch = make_batch(
        seed=seed,
        seq_lens=[40, 16, 33, 21],
        query_lens=[7, 16, 2, 20],
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
    )
    check(batch)


@pytest.mark.parametrize("group_tokens", [1, 32, 4096])
@pytest.mark.parametrize("seq_lens", [[1, 7, 16, 17, 95, 3], [33, 33, 33]])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEAD_LAYOUTS)
def test_decode_only(
    monkeypatch: pytest.MonkeyPatch,
    group_tokens: int,
    seq_lens: list[int],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
) -> None:
    monkeypatch.setattr(paged_attention_module, "DECODE_GROUP_TOKENS", group_tokens)
    batch = make_batch(
        seed=len(seq_lens),
        seq_lens=seq_lens,
        query_lens=[1] * len(seq_lens),
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
    )
    assert batch.metadata.is_decode_only
    check(batch)


def test_decode_many_groups_default_budget() -> None:
    seq_lens = [200 + 37 * i for i in range(24)]
    batch = make_batch(
        seed=3,
        seq_lens=seq_lens,
        query_lens=[1] * len(seq_lens),
        block_size=16,
        num_heads=9,
        num_kv_heads=3,
    )
    check(batch)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEAD_LAYOUTS)
def test_mixed_decode_and_prefill(block_size: int, num_heads: int, num_kv_heads: int) -> None:
    batch = make_batch(
        seed=7,
        seq_lens=[30, 12, 1, 19, 8, 45],
        query_lens=[1, 12, 1, 4, 1, 1],
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
    )
    check(batch)


@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 17, 5]])
def test_out_receives_the_result(query_lens: list[int]) -> None:
    batch = make_batch(
        seed=5,
        seq_lens=[50, 17, 26],
        query_lens=query_lens,
        block_size=5,
        num_heads=6,
        num_kv_heads=2,
    )
    scale = HEAD_DIM**-0.5
    backend = TorchBackend()
    out = torch.full_like(batch.q, float("nan"))
    returned = backend.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.metadata, scale, out=out
    )
    assert returned is out
    expected = backend.paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.metadata, scale)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("sliding_window", [1, 4, 16, 100])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("query_lens", [[1, 1, 1, 1], [1, 9, 30, 3]])
def test_sliding_window(sliding_window: int, block_size: int, query_lens: list[int]) -> None:
    batch = make_batch(
        seed=sliding_window,
        seq_lens=[30, 9, 37, 18],
        query_lens=query_lens,
        block_size=block_size,
        num_heads=6,
        num_kv_heads=2,
    )
    check(batch, sliding_window)


@pytest.mark.parametrize("sliding_window", [None, 8])
@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 17, 5]])
def test_bfloat16(sliding_window: int | None, query_lens: list[int]) -> None:
    batch = make_batch(
        seed=11,
        seq_lens=[50, 17, 26],
        query_lens=query_lens,
        block_size=16,
        num_heads=6,
        num_kv_heads=2,
        dtype=torch.bfloat16,
    )
    check(batch, sliding_window, atol=2e-2)


@pytest.mark.parametrize("sliding_window", [None, 8])
def test_a_bfloat16_row_is_transformers_decode_step(sliding_window: int | None) -> None:
    """On the CPU every bf16 row, a prefill's too, has the bits of SDPA over that row alone and
    its visible keys: what transformers' sdpa computes for a decode step. (A head dim of 128:
    there several query rows of one call round differently from a lone one.)"""
    batch = make_batch(
        seed=12,
        seq_lens=[50, 17, 33],
        query_lens=[1, 17, 20],
        block_size=16,
        num_heads=16,
        num_kv_heads=4,
        dtype=torch.bfloat16,
        head_dim=128,
    )
    scale = 128**-0.5
    out = TorchBackend().paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.metadata, scale, sliding_window
    )
    row = 0
    for seq_keys, seq_values, query_len in zip(
        batch.keys, batch.values, batch.metadata.query_lens, strict=True
    ):
        seq_len = seq_keys.shape[0]
        for position in range(seq_len - query_len, seq_len):
            first = paged_attention_module.first_visible(position, sliding_window)
            # (1, heads, 1, dim) over (1, kv_heads, keys, dim)
            alone = functional.scaled_dot_product_attention(
                batch.q[row][None, :, None],
                seq_keys[first : position + 1].transpose(0, 1)[None],
                seq_values[first : position + 1].transpose(0, 1)[None],
                scale=scale,
                enable_gqa=True,
            )
            assert torch.equal(out[row], alone[0, :, 0]), f"position {position}"
            row += 1


def test_leaves_inputs_untouched() -> None:
    batch = make_batch(
        seed=5,
        seq_lens=[20, 9, 14],
        query_lens=[1, 9, 1],
        block_size=4,
        num_heads=4,
        num_kv_heads=2,
    )
    before = [t.clone() for t in (batch.q, batch.k_cache, batch.v_cache)]
    TorchBackend().paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.metadata, 0.25, 6)
    for tensor, copy in zip((batch.q, batch.k_cache, batch.v_cache), before, strict=True):
        torch.testing.assert_close(tensor, copy, rtol=0, atol=0, equal_nan=True)


def test_rejects_uneven_head_groups() -> None:
    batch = make_batch(
        seed=0, seq_lens=[4], query_lens=[4], block_size=4, num_heads=4, num_kv_heads=4
    )
    with pytest.raises(ValueError, match="3 query heads"):
        TorchBackend().paged_attention(
            batch.q[:, :3], batch.k_cache, batch.v_cache, batch.metadata, 1.0
        )


@pytest.mark.parametrize("sliding_window", [0, -3])
def test_rejects_empty_sliding_window(sliding_window: int) -> None:
    batch = make_batch(
        seed=0, seq_lens=[4], query_lens=[1], block_size=4, num_heads=4, num_kv_heads=4
    )
    with pytest.raises(ValueError, match="sliding_window must be at least 1"):
        TorchBackend().paged_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.metadata, 1.0, sliding_window
        )


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    seq_lens = draw(st.lists(st.integers(1, 48), min_size=1, max_size=5))
    query_lens = [draw(st.sampled_from([1, seq_len, max(1, seq_len // 3)])) for seq_len in seq_lens]
    return seq_lens, query_lens


@settings(max_examples=60, deadline=None)
@given(
    lens=batches(),
    block_size=st.sampled_from(BLOCK_SIZES),
    heads=st.sampled_from(HEAD_LAYOUTS),
    sliding_window=st.none() | st.integers(1, 24),
    group_tokens=st.sampled_from([1, 20, 4096]),
    seed=st.integers(0, 2**16),
)
def test_matches_dense_attention(
    lens: tuple[list[int], list[int]],
    block_size: int,
    heads: tuple[int, int],
    sliding_window: int | None,
    group_tokens: int,
    seed: int,
) -> None:
    seq_lens, query_lens = lens
    batch = make_batch(
        seed=seed,
        seq_lens=seq_lens,
        query_lens=query_lens,
        block_size=block_size,
        num_heads=heads[0],
        num_kv_heads=heads[1],
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(paged_attention_module, "DECODE_GROUP_TOKENS", group_tokens)
        check(batch, sliding_window)


def test_plan_built_once_per_step_and_window(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = make_batch(
        seed=13,
        seq_lens=[30, 12, 1, 19, 8, 45],
        query_lens=[1, 12, 1, 4, 1, 1],
        block_size=5,
        num_heads=6,
        num_kv_heads=2,
    )
    built: list[int | None] = []
    plan_decode = paged_attention_module.plan_decode

    def counting(
        metadata: AttentionMetadata, sliding_window: int | None
    ) -> paged_attention_module.DecodePlan:
        built.append(sliding_window)
        return plan_decode(metadata, sliding_window)

    monkeypatch.setattr(paged_attention_module, "plan_decode", counting)
    scale = HEAD_DIM**-0.5
    # The reference kernel (CUDA's torch path); the CPU's is row_invariant_attention.
    reference = paged_attention_module.paged_attention
    layer_windows = [None, 8, None, 8, None, None]  # alternating global / sliding layers
    outputs = [
        reference(batch.q, batch.k_cache, batch.v_cache, batch.metadata, scale, w)
        for w in layer_windows
    ]
    assert built == [None, 8]
    plans = {w: paged_attention_module.decode_plan(batch.metadata, w) for w in (None, 8)}
    assert plans[None] is not plans[8]
    assert plans[None].sliding_window is None
    assert plans[8].sliding_window == 8
    assert paged_attention_module.decode_plan(batch.metadata, None) is plans[None]
    assert built == [None, 8]
    # Reusing the plan changes nothing: every layer agrees with a fresh, uncached plan.
    fresh = build_attention_metadata(
        block_tables=batch.metadata.block_tables.tolist(),
        seq_lens=batch.metadata.seq_lens,
        query_lens=batch.metadata.query_lens,
        block_size=batch.metadata.block_size,
    )
    for window, out in zip(layer_windows, outputs, strict=True):
        expected = reference(batch.q, batch.k_cache, batch.v_cache, fresh, scale, window)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    check(batch)
    check(batch, 8)
    assert built == [None, 8, None, 8]


def test_plan_decode_splits_rows() -> None:
    metadata = build_attention_metadata(
        block_tables=[[0, 1], [2], [3, 4, 5], [6]],
        seq_lens=[7, 3, 11, 4],
        query_lens=[1, 3, 1, 2],
        block_size=4,
    )
    plan = paged_attention_module.plan_decode(metadata, None)
    decode_tokens = sorted(t for g in plan.decode_groups for t in g.tokens.tolist())
    assert decode_tokens == [0, 4]  # sequences 0 and 2 decode: tokens 0 and 1 + 3
    assert [p.tokens for p in plan.prefills] == [slice(1, 4), slice(5, 7)]
    with pytest.raises(ValueError, match="sliding_window must be at least 1"):
        paged_attention_module.plan_decode(metadata, 0)
