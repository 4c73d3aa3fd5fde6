"""The cupy backend's kernels for ``sparse_latent_attention`` (``kernels/dsa.cu``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from metrale_kernels.backend import KernelBackend
from metrale_kernels.cuda import launch as cuda
from metrale_kernels.cuda.launch import MAX_SHARED_BYTES, f32, i32, ptr
from metrale_kernels.op import kernel

if TYPE_CHECKING:
    from metrale_kernels.cuda.backend import CupyBackend

DSA_THREADS = 128
DSA_TILE = 16
DSA_MAX_ACCUMULATORS = 16


def _dsa_shared_bytes(heads_per_block: int, rank: int) -> int:
    floats = heads_per_block * (rank + DSA_TILE + 3) + DSA_TILE * (rank + 1)
    return 4 * floats


def _dsa_heads_per_block(num_heads: int, rank: int) -> int | None:
    """The most heads one block can hold (accumulators and shared memory); ``None``: not one."""
    heads = min(num_heads, DSA_MAX_ACCUMULATORS * DSA_THREADS // rank)
    # The kernel's static shared memory: one slot id per tile position.
    while heads > 0 and _dsa_shared_bytes(heads, rank) > MAX_SHARED_BYTES - 8 * DSA_TILE:
        heads -= 1
    return heads or None


@kernel(KernelBackend.sparse_latent_attention)
def sparse_latent_attention(
    backend: CupyBackend,
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    block_table: torch.Tensor,
    selected: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    suffix = cuda.dtype_suffix(q.dtype)
    num_queries, num_heads, rank = q.shape
    heads_per_block = _dsa_heads_per_block(num_heads, rank)
    if (
        not cuda.on_cuda(q)
        or suffix is None
        or latent_cache.dtype != q.dtype
        or not latent_cache.is_contiguous()
        or heads_per_block is None
    ):
        return backend.fallback(KernelBackend.sparse_latent_attention, f"{q.dtype} q, rank {rank}")(
            q, latent_cache, block_table, selected, scale
        )
    q = q.contiguous()
    chosen = selected.to(torch.int64).contiguous()
    out = torch.empty_like(q)
    if num_queries and num_heads:
        cuda.launch(
            "dsa",
            f"sparse_latent_attention_{suffix}",
            q.device,
            (num_queries, -(-num_heads // heads_per_block)),
            (DSA_THREADS,),
            (
                ptr(out),
                ptr(q),
                ptr(latent_cache),
                ptr(block_table.to(torch.int64).contiguous()),
                ptr(chosen),
                i32(num_heads),
                i32(heads_per_block),
                i32(rank),
                i32(latent_cache.shape[1]),
                i32(chosen.shape[1]),
                f32(scale),
            ),
            shared_mem_bytes=_dsa_shared_bytes(heads_per_block, rank),
        )
    return out
