"""The cupy backend's kernels for ``apply_rotary`` (``kernels/rotary.cu``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from metrale_kernels.backend import KernelBackend
from metrale_kernels.cuda import launch as cuda
from metrale_kernels.cuda.launch import i32, i64, ptr
from metrale_kernels.op import kernel

if TYPE_CHECKING:
    from metrale_kernels.cuda.backend import CupyBackend


@kernel(KernelBackend.apply_rotary)
def apply_rotary(
    backend: CupyBackend,
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    suffix = cuda.dtype_suffix(q.dtype)
    head_dim = q.shape[-1]
    if (
        not cuda.on_cuda(q)
        or suffix is None
        or k.dtype != q.dtype
        or q.dim() != 3
        or k.dim() != 3
        or cos_sin_cache.dtype != torch.float32
        or cos_sin_cache.shape[-1] != head_dim
        or k.shape[-1] != head_dim
    ):
        return backend.fallback(
            KernelBackend.apply_rotary, f"{q.dtype} q of {q.dim()} dims, {cos_sin_cache.dtype}"
        )(q, k, positions, cos_sin_cache)
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    q_out, k_out = (
        torch.empty(q.shape, dtype=q.dtype, device=q.device),
        torch.empty(k.shape, dtype=k.dtype, device=k.device),
    )
    if q.shape[0]:
        cuda.launch(
            "rotary",
            f"rotary_{suffix}",
            q.device,
            (q.shape[0],),
            (128,),
            (
                ptr(q_out),
                ptr(k_out),
                ptr(q),
                ptr(k),
                ptr(positions.to(torch.int64).contiguous()),
                ptr(cos_sin_cache.contiguous()),
                i32(q.shape[1]),
                i32(k.shape[1]),
                i32(head_dim),
                i64(q.stride(0)),
                i64(q.stride(1)),
                i64(k.stride(0)),
                i64(k.stride(1)),
            ),
        )
    return q_out, k_out
