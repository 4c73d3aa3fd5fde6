"""A sliding-window layer's attention over its ring (the step's ring view) is bit for bit its
attention over the paged pool: the torch paths (the row-invariant one with and without sinks)
and the cpu backend's native kernel (float32); prefill chunks and decode steps, several
sequences in their own slots, windows wrapped around the ring many times."""

from __future__ import annotations

import random

import pytest
import torch

from metrale_kernels import KernelBackend, TorchBackend, build_attention_metadata
from metrale_kernels.cpu.backend import CpuBackend
from metrale_kernels.reference.row_invariant_attention import row_invariant_attention
from metrale_model_arch.sliding_window_ring import ring_blocks
from metrale_server.engine.ring_views import ring_view, with_ring_views

WINDOW = 9
BLOCK_SIZE = 4
STEP_TOKENS = 8
KV_HEADS, HEADS, DIM = 2, 4, 8
LENGTHS = (91, 47, 70)  # each sequence's final length
SLOTS = (2, 0, 1)  # the state slot each sequence holds


def kernel_backend(name: str) -> KernelBackend:
    if name == "torch":
        return TorchBackend()
    cpu = CpuBackend()
    if cpu.native is None:
        pytest.skip("the native cpu ops are not built here")
    return cpu


@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize(
    ("name", "dtype"),
    [("torch", torch.float32), ("torch", torch.bfloat16), ("cpu", torch.float32)],
)
def test_attention_over_the_ring_equals_the_pool(
    name: str, dtype: torch.dtype, with_sinks: bool
) -> None:
    rng = random.Random(0)
    generator = torch.Generator().manual_seed(0)
    backend = kernel_backend(name)
    sinks = torch.randn(HEADS, generator=generator) if with_sinks else None
    blocks = ring_blocks(WINDOW, STEP_TOKENS, BLOCK_SIZE)
    ring_tokens = blocks * BLOCK_SIZE
    assert ring_tokens < min(LENGTHS) // 2  # every ring wraps around more than once
    pool_blocks_per_seq = -(-max(LENGTHS) // BLOCK_SIZE)
    num_pool_blocks = len(LENGTHS) * pool_blocks_per_seq
    pool = [torch.zeros(num_pool_blocks, BLOCK_SIZE, KV_HEADS, DIM, dtype=dtype) for _ in "kv"]
    # The rings of 3 slots (one spare), as the runner views them: (slots * blocks, block, ...).
    rings = [torch.zeros(3 * blocks, BLOCK_SIZE, KV_HEADS, DIM, dtype=dtype) for _ in "kv"]
    # Shuffled pool blocks: a sequence's blocks are not contiguous.
    ids = list(range(num_pool_blocks))
    rng.shuffle(ids)
    tables = [ids[i * pool_blocks_per_seq : (i + 1) * pool_blocks_per_seq] for i in range(3)]
    done = [0, 0, 0]
    num_steps = 0
    while done != list(LENGTHS):
        seqs = [i for i in range(3) if done[i] < LENGTHS[i]]
        query_lens = [min(rng.randint(1, STEP_TOKENS), LENGTHS[i] - done[i]) for i in seqs]
        seq_lens = [done[i] + n for i, n in zip(seqs, query_lens, strict=True)]
        metadata = build_attention_metadata(
            block_tables=[tables[i] for i in seqs],
            seq_lens=seq_lens,
            query_lens=query_lens,
            block_size=BLOCK_SIZE,
            state_slots=[SLOTS[i] for i in seqs],
        )
        view = with_ring_views(metadata, {WINDOW: blocks}).for_window(WINDOW)
        assert view is not metadata
        num_tokens = sum(query_lens)
        q = torch.randn(num_tokens, HEADS, DIM, generator=generator).to(dtype)
        k, v = (torch.randn(num_tokens, KV_HEADS, DIM, generator=generator).to(dtype) for _ in "kv")
        backend.write_kv(k, v, *pool, metadata.slot_mapping)
        backend.write_kv(k, v, *rings, view.slot_mapping)
        scale = DIM**-0.5
        expected = backend.paged_attention(q, *pool, metadata, scale, WINDOW)
        assert torch.equal(backend.paged_attention(q, *rings, view, scale, WINDOW), expected)
        expected = row_invariant_attention(q, *pool, metadata, scale, WINDOW, sinks=sinks)
        got = row_invariant_attention(q, *rings, view, scale, WINDOW, sinks=sinks)
        assert torch.equal(got, expected)
        for i, n in zip(seqs, query_lens, strict=True):
            done[i] += n
        num_steps += 1
    assert num_steps > 10


def test_the_ring_view_addresses_each_slot_by_position_modulo_the_ring() -> None:
    # One sequence in slot 2 running positions 9..12 of a 13-token context; rings of 3 blocks.
    metadata = build_attention_metadata(
        block_tables=[[7, 3, 5, 1]], seq_lens=[13], query_lens=[4], block_size=4, state_slots=[2]
    )
    view = ring_view(metadata, 3)
    # Logical block j -> 2 * 3 + j mod 3; position p -> 2 * 12 + p mod 12.
    assert view.block_tables.tolist() == [[6, 7, 8, 6]]
    assert view.slot_mapping.tolist() == [24 + 9, 24 + 10, 24 + 11, 24 + 0]
    assert metadata.for_window(5) is metadata
    assert metadata.for_window(None) is metadata
