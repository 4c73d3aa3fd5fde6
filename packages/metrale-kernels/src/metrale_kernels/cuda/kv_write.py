"""The cupy backend's kernels for ``write_kv`` (``kernels/kv_write.cu``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from metrale_kernels.backend import KernelBackend
from metrale_kernels.cuda import launch as cuda
from metrale_kernels.cuda.launch import i32, i64, ptr
from metrale_kernels.op import kernel
from metrale_kernels.reference.kv_quantization import cache_head_dim

if TYPE_CHECKING:
    from metrale_kernels.cuda.backend import CupyBackend


@kernel(KernelBackend.write_kv)
def write_kv(
    backend: CupyBackend,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    function = _write_kv_function(key, value, k_cache, v_cache)
    if (
        function is None
        or not cuda.on_cuda(k_cache)
        or not (k_cache.is_contiguous() and v_cache.is_contiguous())
    ):
        backend.fallback(KernelBackend.write_kv, f"{key.dtype} keys into a {k_cache.dtype} cache")(
            key, value, k_cache, v_cache, slot_mapping
        )
        return
    num_kv_heads, head_dim = k_cache.shape[-2], cache_head_dim(k_cache)
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    if key.shape[0]:
        cuda.launch(
            "kv_write",
            function,
            k_cache.device,
            (key.shape[0],),
            (128,),
            (
                ptr(k_cache),
                ptr(v_cache),
                ptr(key),
                ptr(value),
                ptr(slot_mapping.to(torch.int64).contiguous()),
                i32(num_kv_heads),
                i32(head_dim),
                i64(key.stride(0)),
                i64(key.stride(1)),
                i64(value.stride(0)),
                i64(value.stride(1)),
            ),
        )


def _write_kv_function(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> str | None:
    """The kernel that writes ``key`` and ``value`` into these caches; ``None`` when none does:
    a float cache takes its own dtype, a quantized one (rows of ``head_dim + SCALE_BYTES``)
    any float dtype."""
    suffix = cuda.dtype_suffix(key.dtype)
    if suffix is None or not (key.dtype == value.dtype and k_cache.dtype == v_cache.dtype):
        return None
    kv_format = cuda.kv_format_suffix(k_cache.dtype)
    if kv_format is None:
        return f"write_kv_{suffix}" if k_cache.dtype == key.dtype else None
    is_row = (
        k_cache.shape == v_cache.shape
        and cache_head_dim(k_cache) == key.shape[-1] == value.shape[-1]
    )
    return f"write_kv_{kv_format}_{suffix}" if is_row else None
