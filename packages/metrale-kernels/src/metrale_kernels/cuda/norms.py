"""The cupy backend's kernels for ``rms_norm`` and ``add_rms_norm`` (``kernels/norms.cu``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from metrale_kernels.backend import KernelBackend
from metrale_kernels.cuda import launch as cuda
from metrale_kernels.cuda.launch import f32, i32, i64, ptr
from metrale_kernels.op import kernel

if TYPE_CHECKING:
    from metrale_kernels.cuda.backend import CupyBackend


def _norm_threads(hidden: int) -> int:
    return min(256, 32 * -(-hidden // 32))


@kernel(KernelBackend.rms_norm)
def rms_norm(
    backend: CupyBackend,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    suffix = cuda.dtype_suffix(x.dtype)
    if not cuda.on_cuda(x) or suffix is None or weight.dtype != x.dtype or x.dim() > 3:
        return backend.fallback(
            KernelBackend.rms_norm, f"{x.dtype} x, {weight.dtype} weight, {x.dim()} dims"
        )(x, weight, eps, out=out)
    hidden = x.shape[-1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    # (outer, inner, hidden), the last dim dense.
    view = x if x.dim() == 3 else x.view(1, 1, hidden) if x.dim() == 1 else x.unsqueeze(1)
    outer, inner = view.shape[0], view.shape[1]
    result = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if view.numel():
        cuda.launch(
            "norms",
            f"rms_norm_{suffix}",
            x.device,
            (outer * inner,),
            (_norm_threads(hidden),),
            (
                ptr(result),
                ptr(view),
                ptr(weight.contiguous()),
                i32(inner),
                i64(view.stride(0)),
                i64(view.stride(1)),
                i32(hidden),
                f32(eps),
            ),
        )
    return cuda.into(result, out)


@kernel(KernelBackend.add_rms_norm)
def add_rms_norm(
    backend: CupyBackend, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    suffix = cuda.dtype_suffix(x.dtype)
    if (
        not cuda.on_cuda(x)
        or suffix is None
        or not (weight.dtype == residual.dtype == x.dtype)
        or x.shape != residual.shape
    ):
        return backend.fallback(
            KernelBackend.add_rms_norm, f"{x.dtype} x, {residual.dtype} residual"
        )(x, residual, weight, eps)
    hidden = x.shape[-1]
    x, residual = x.contiguous(), residual.contiguous()
    normed = torch.empty_like(x)
    summed = torch.empty_like(x)
    if x.numel():
        cuda.launch(
            "norms",
            f"add_rms_norm_{suffix}",
            x.device,
            (x.numel() // hidden,),
            (_norm_threads(hidden),),
            (
                ptr(normed),
                ptr(summed),
                ptr(x),
                ptr(residual),
                ptr(weight.contiguous()),
                i32(hidden),
                f32(eps),
            ),
        )
    return normed, summed
