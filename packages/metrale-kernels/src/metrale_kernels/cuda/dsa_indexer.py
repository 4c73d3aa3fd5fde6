"""The cupy backend's kernels for ``index_scores`` and ``pool_index_keys``
(``kernels/dsa_indexer.cu``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from metrale_kernels.backend import KernelBackend
from metrale_kernels.cuda import launch as cuda
from metrale_kernels.cuda.launch import MAX_SHARED_BYTES, f32, i32, i64, ptr
from metrale_kernels.op import kernel

if TYPE_CHECKING:
    from metrale_kernels.cuda.backend import CupyBackend

INDEXER_THREADS = 128
INDEXER_TILE = 32


@kernel(KernelBackend.index_scores)
def index_scores(
    backend: CupyBackend,
    index_q: torch.Tensor,
    head_weights: torch.Tensor,
    pooled_keys: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    suffix = cuda.dtype_suffix(index_q.dtype)
    num_queries, num_heads, dim = index_q.shape
    num_pools = pooled_keys.shape[0]
    shared_bytes = 4 * (INDEXER_TILE * (dim + 1) + INDEXER_THREADS // 32 * INDEXER_TILE)
    if not cuda.on_cuda(index_q) or suffix is None or shared_bytes > MAX_SHARED_BYTES:
        return backend.fallback(
            KernelBackend.index_scores, f"{index_q.dtype} queries of dim {dim}"
        )(index_q, head_weights, pooled_keys, scale)
    q = index_q.contiguous()
    weights = head_weights.to(torch.float32).contiguous()
    keys = pooled_keys.to(torch.float32).contiguous()
    scores = torch.empty((num_queries, num_pools), dtype=torch.float32, device=q.device)
    if num_queries and num_pools:
        cuda.launch(
            "dsa_indexer",
            f"index_scores_{suffix}",
            q.device,
            (num_queries, -(-num_pools // INDEXER_TILE)),
            (INDEXER_THREADS,),
            (
                ptr(scores),
                ptr(q),
                ptr(weights),
                ptr(keys),
                i32(num_pools),
                i32(num_heads),
                i32(dim),
                f32(scale),
            ),
            shared_mem_bytes=shared_bytes,
        )
    return scores


@kernel(KernelBackend.pool_index_keys)
def pool_index_keys(
    backend: CupyBackend, keys: torch.Tensor, gate_logits: torch.Tensor
) -> torch.Tensor:
    suffix = cuda.dtype_suffix(keys.dtype)
    if (
        not cuda.on_cuda(keys)
        or suffix is None
        or gate_logits.dtype != keys.dtype
        or keys.dim() != 3
        or gate_logits.shape != keys.shape
    ):
        return backend.fallback(
            KernelBackend.pool_index_keys, f"{keys.dtype} keys, {gate_logits.dtype} logits"
        )(keys, gate_logits)
    keys, gate_logits = keys.contiguous(), gate_logits.contiguous()
    num_pools, pool, dim = keys.shape
    out = torch.empty((num_pools, dim), dtype=torch.float32, device=keys.device)
    total = num_pools * dim
    if total and pool:
        cuda.launch(
            "dsa_indexer",
            f"pool_index_keys_{suffix}",
            keys.device,
            (-(-total // 256),),
            (256,),
            (ptr(out), ptr(keys), ptr(gate_logits), i64(num_pools), i32(pool), i32(dim)),
        )
    elif total:
        return backend.fallback(KernelBackend.pool_index_keys, "pools of no tokens")(
            keys, gate_logits
        )
    return out
