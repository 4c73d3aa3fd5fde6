"""Random ragged batches over a paged K/V cache, for checking attention kernels.

Cache blocks are shuffled and every slot outside a sequence's context is NaN, so a kernel that
reads a slot it should not poisons its output.
"""

from __future__ import annotations

import attrs
import torch

from metrale_kernels.attention_metadata import AttentionMetadata, build_attention_metadata
from metrale_kernels.backend import KernelBackend, TorchBackend
from metrale_kernels.reference.kv_quantization import SCALE_BYTES, is_quantized_dtype


@attrs.frozen(kw_only=True)
class PagedBatch:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    metadata: AttentionMetadata


def paged_batch(
    *,
    seq_lens: list[int],
    query_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    block_size: int = 16,
    seed: int = 0,
    kv_dtype: torch.dtype | None = None,
) -> PagedBatch:
    """A ragged batch over shuffled cache blocks; every slot outside a context is NaN.

    The caches are of ``kv_dtype`` (``dtype`` when None): a quantized one's rows hold the
    scale bytes too, and its unwritten rows read as NaN (all bytes 0xFF)."""
    generator = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables, start = [], 0
    for n in blocks_per_seq:
        tables.append(order[start : start + n])
        start += n
    metadata = build_attention_metadata(
        block_tables=tables,
        seq_lens=seq_lens,
        query_lens=list(seq_lens),
        block_size=block_size,
        device=device,
    )
    k_cache, v_cache = (
        _nan_cache((num_blocks, block_size, num_kv_heads, head_dim), kv_dtype or dtype, device)
        for _ in "kv"
    )
    num_tokens = sum(seq_lens)
    keys = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator)
    values = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator)
    TorchBackend().write_kv(
        keys.to(device, dtype), values.to(device, dtype), k_cache, v_cache, metadata.slot_mapping
    )
    step = build_attention_metadata(
        block_tables=tables,
        seq_lens=seq_lens,
        query_lens=query_lens,
        block_size=block_size,
        device=device,
    )
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=generator)
    return PagedBatch(q=q.to(device, dtype), k_cache=k_cache, v_cache=v_cache, metadata=step)


def _nan_cache(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if not is_quantized_dtype(dtype):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    rows = (*shape[:-1], shape[-1] + SCALE_BYTES)
    return torch.full(rows, 0xFF, dtype=torch.uint8, device=device).view(dtype)


def batch_invariance(
    backend: KernelBackend,
    dtype: torch.dtype,
    device: torch.device,
    num_others: tuple[int, ...] = (7, 63),
    query_lens: tuple[int, ...] = (1, 37),
    kv_dtype: torch.dtype | None = None,
    sinks: torch.Tensor | None = None,
) -> bool:
    """Whether ``backend`` gives one sequence's decode and prefill rows bit-identical alone and
    among ``num_others`` other sequences of random lengths (its own inputs the same each time);
    ``sinks``: the 8 heads' sink logits, passed to ``paged_attention``.
    """
    generator = torch.Generator().manual_seed(7)
    outputs = []
    for others in (0, *num_others):
        lengths = torch.randint(1, 3000, (others,), generator=generator).tolist()
        # The sequence under test goes first: its rows of q and out are the same rows.
        for query_len in query_lens:
            batch = paged_batch(
                seq_lens=[1500, *lengths],
                query_lens=[query_len] + [1] * others,
                num_heads=8,
                num_kv_heads=2,
                head_dim=64,
                dtype=dtype,
                device=device,
                seed=0,
                kv_dtype=kv_dtype,
            )
            alone = paged_batch(
                seq_lens=[1500],
                query_lens=[query_len],
                num_heads=8,
                num_kv_heads=2,
                head_dim=64,
                dtype=dtype,
                device=device,
                seed=0,
                kv_dtype=kv_dtype,
            )
            # The same q and context for the sequence under test, wherever its blocks are.
            q = batch.q.clone()
            q[:query_len] = alone.q
            _copy_context(alone, batch)
            out = backend.paged_attention(
                q, batch.k_cache, batch.v_cache, batch.metadata, 0.125, sinks=sinks
            )
            outputs.append((query_len, out[:query_len]))
    return all(
        torch.equal(out, next(o for n, o in outputs if n == query_len))
        for query_len, out in outputs
    )


def _copy_context(source: PagedBatch, target: PagedBatch) -> None:
    """Sequence 0's cached K/V of ``source`` into sequence 0's blocks of ``target``."""
    for column in range(-(-source.metadata.seq_lens[0] // source.metadata.block_size)):
        src = int(source.metadata.block_tables[0, column])
        dst = int(target.metadata.block_tables[0, column])
        # (As bytes: torch cannot assign fp8 tensors.)
        for role in ("k_cache", "v_cache"):
            getattr(target, role).view(torch.uint8)[dst] = getattr(source, role).view(torch.uint8)[
                src
            ]
