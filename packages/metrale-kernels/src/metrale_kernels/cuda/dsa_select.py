"""The cupy backend's kernels for ``select_positions`` (``kernels/dsa_select.cu``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from metrale_kernels.backend import KernelBackend
from metrale_kernels.cuda import launch as cuda
from metrale_kernels.cuda.launch import i32, i64, ptr
from metrale_kernels.op import kernel

if TYPE_CHECKING:
    from metrale_kernels.cuda.backend import CupyBackend

SELECT_THREADS = 256
SELECT_MAX_POOLS = 4096


@kernel(KernelBackend.select_positions)
def select_positions(
    backend: CupyBackend,
    scores: torch.Tensor,
    positions: torch.Tensor,
    *,
    kpool: int,
    topk_pools: int,
    select_tail: bool,
) -> torch.Tensor:
    num_queries, num_pools = scores.shape
    complete = int(((positions.long() + 1) // max(kpool, 1)).max()) if num_queries else 0
    if (
        not cuda.on_cuda(scores)
        or kpool < 1
        or topk_pools < 1
        or num_pools > SELECT_MAX_POOLS
        or complete > num_pools
    ):
        # The reference raises the contract's errors.
        return backend.fallback(
            KernelBackend.select_positions, f"{num_pools} pools, kpool {kpool}"
        )(scores, positions, kpool=kpool, topk_pools=topk_pools, select_tail=select_tail)
    width = topk_pools * kpool + max(kpool - 1, 0)
    out = torch.empty((num_queries, width), dtype=torch.int64, device=scores.device)
    ranked = scores.to(torch.float32)
    ranked = ranked if ranked.stride(-1) == 1 else ranked.contiguous()
    if num_queries:
        cuda.launch(
            "dsa_select",
            "select_positions",
            scores.device,
            (num_queries,),
            (SELECT_THREADS,),
            (
                ptr(out),
                ptr(ranked),
                ptr(positions.to(torch.int64).contiguous()),
                i64(ranked.stride(0)),
                i32(kpool),
                i32(topk_pools),
                i32(min(topk_pools, num_pools)),
                i32(int(select_tail)),
                i32(width),
            ),
        )
    return out
