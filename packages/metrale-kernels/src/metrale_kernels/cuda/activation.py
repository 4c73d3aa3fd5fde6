"""The cupy backend's kernels for ``silu_and_mul`` (``kernels/activation.cu``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from metrale_kernels.backend import KernelBackend
from metrale_kernels.cuda import launch as cuda
from metrale_kernels.cuda.launch import i32, i64, ptr
from metrale_kernels.op import kernel

if TYPE_CHECKING:
    from metrale_kernels.cuda.backend import CupyBackend


@kernel(KernelBackend.silu_and_mul)
def silu_and_mul(
    backend: CupyBackend, x: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    suffix = cuda.dtype_suffix(x.dtype)
    if not cuda.on_cuda(x) or suffix is None:
        return backend.fallback(KernelBackend.silu_and_mul, f"{x.dtype} on {x.device.type}")(
            x, out=out
        )
    width = x.shape[-1]
    rows2d = x if x.dim() == 2 and x.stride(-1) == 1 else x.contiguous().view(-1, width)
    num_rows, d = rows2d.shape[0], width // 2
    result = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    total = num_rows * d
    if total:
        cuda.launch(
            "activation",
            f"silu_and_mul_{suffix}",
            x.device,
            (min(-(-total // 256), 16384),),
            (256,),
            (ptr(result), ptr(rows2d), i64(num_rows), i32(d), i64(rows2d.stride(0))),
        )
    return cuda.into(result, out)
