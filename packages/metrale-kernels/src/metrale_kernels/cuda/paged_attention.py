"""The cupy backend's kernel for ``paged_attention`` (``kernels/paged_attention.cu``): a
split-K partial pass over the rows of :mod:`~metrale_kernels.cuda.attention_rows`, then a
combine pass."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from metrale_kernels.attention_metadata import AttentionMetadata
from metrale_kernels.backend import KernelBackend
from metrale_kernels.cuda import attention_rows
from metrale_kernels.cuda import launch as cuda
from metrale_kernels.cuda.launch import MAX_SHARED_BYTES, f32, i32, i64, ptr
from metrale_kernels.op import kernel
from metrale_kernels.reference.kv_quantization import cache_head_dim

if TYPE_CHECKING:
    from metrale_kernels.cuda.backend import CupyBackend

ATTENTION_THREADS = 128
ATTENTION_TILE = 32
MAX_ACCUMULATORS = 16
# Rows per paged attention launch: bounds the float32 split partials.
PARTIAL_BUDGET_BYTES = 64 * 2**20


def _attention_shared_bytes(group: int, head_dim: int) -> int:
    floats = group * head_dim + ATTENTION_TILE * (head_dim + 1) + group * ATTENTION_TILE + 3 * group
    return 4 * floats


@kernel(KernelBackend.paged_attention)
def paged_attention(
    backend: CupyBackend,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    *,
    out: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if sinks is not None:
        return backend.fallback(KernelBackend.paged_attention, "sinks")(
            q, k_cache, v_cache, metadata, scale, sliding_window, out=out, sinks=sinks
        )
    if num_heads % num_kv_heads or (sliding_window is not None and sliding_window < 1):
        # The reference raises the contract's ValueError.
        return backend.fallback(KernelBackend.paged_attention, "the reference raises")(
            q, k_cache, v_cache, metadata, scale, sliding_window, out=out
        )
    function = _partial_function(q, k_cache, v_cache)
    group = num_heads // num_kv_heads
    if (
        not cuda.on_cuda(q)
        or function is None
        or not (k_cache.is_contiguous() and v_cache.is_contiguous())
        or group * head_dim > MAX_ACCUMULATORS * ATTENTION_THREADS
        or _attention_shared_bytes(group, head_dim) > MAX_SHARED_BYTES
    ):
        return backend.fallback(
            KernelBackend.paged_attention,
            f"{q.dtype} q over a {k_cache.dtype} cache, {group} x {head_dim} per kv head",
        )(q, k_cache, v_cache, metadata, scale, sliding_window, out=out)
    q = q if q.stride(-1) == 1 else q.contiguous()
    result = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    rows = attention_rows.attention_rows(metadata, sliding_window)
    if num_tokens:
        _paged_attention_launches(
            result, q, k_cache, v_cache, metadata, rows, scale, sliding_window, function
        )
    return cuda.into(result, out)


def _partial_function(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> str | None:
    """The partial pass's kernel for ``q`` over these caches; ``None`` when none takes them: a
    float cache of ``q``'s dtype, or a quantized one of ``q``'s head dim (any float ``q``)."""
    suffix = cuda.dtype_suffix(q.dtype)
    if suffix is None or k_cache.dtype != v_cache.dtype:
        return None
    kv_format = cuda.kv_format_suffix(k_cache.dtype)
    if kv_format is None:
        return f"paged_attention_partial_{suffix}" if k_cache.dtype == q.dtype else None
    if k_cache.shape != v_cache.shape or cache_head_dim(k_cache) != q.shape[-1]:
        return None  # the reference raises
    return f"paged_attention_partial_{kv_format}_{suffix}"


def _paged_attention_launches(
    result: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    rows: attention_rows.AttentionRows,
    scale: float,
    sliding_window: int | None,
    partial_function: str,
) -> None:
    """Both passes over the rows, in chunks whose partials fit ``PARTIAL_BUDGET_BYTES``."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    max_splits = rows.max_splits
    row_bytes = 4 * num_heads * max_splits * (head_dim + 2)
    chunk = max(1, min(num_tokens, PARTIAL_BUDGET_BYTES // row_bytes))
    part_acc = torch.empty(
        (chunk, num_heads, max_splits, head_dim), dtype=torch.float32, device=q.device
    )
    part_ml = torch.empty((chunk, num_heads, max_splits, 2), dtype=torch.float32, device=q.device)
    window = 0 if sliding_window is None else sliding_window
    # 16 bytes a load from a float cache; two values a load from a quantized one.
    load_bytes = 16 if cuda.kv_format_suffix(k_cache.dtype) is None else 2
    per_vector = load_bytes // k_cache.element_size()
    vector_loads = head_dim % per_vector == 0 and all(
        cache.data_ptr() % load_bytes == 0 for cache in (k_cache, v_cache)
    )
    tables = metadata.block_tables
    if tables.stride(-1) != 1:
        tables = tables.contiguous()
    for start in range(0, num_tokens, chunk):
        stop = min(num_tokens, start + chunk)
        row_seq, row_pos = rows.row_seq[start:stop], rows.row_pos[start:stop]
        cuda.launch(
            "paged_attention",
            partial_function,
            q.device,
            (stop - start, num_kv_heads, max_splits),
            (ATTENTION_THREADS,),
            (
                ptr(part_acc),
                ptr(part_ml),
                ptr(q[start:stop]),
                ptr(k_cache),
                ptr(v_cache),
                ptr(tables),
                i64(tables.stride(0)),
                ptr(row_seq),
                ptr(row_pos),
                i32(num_heads),
                i32(num_kv_heads),
                i32(head_dim),
                i32(block_size),
                i64(q.stride(0)),
                i64(q.stride(1)),
                f32(scale),
                i32(window),
                i32(attention_rows.SPLIT_KEYS),
                i32(max_splits),
                i32(int(vector_loads)),
            ),
            shared_mem_bytes=_attention_shared_bytes(group, head_dim),
        )
        cuda.launch(
            "paged_attention",
            f"paged_attention_combine_{cuda.dtype_suffix(q.dtype)}",
            q.device,
            (stop - start, num_heads),
            (min(ATTENTION_THREADS, 32 * -(-head_dim // 32)),),
            (
                ptr(result[start:stop]),
                ptr(part_acc),
                ptr(part_ml),
                ptr(row_pos),
                i32(num_heads),
                i32(head_dim),
                i32(window),
                i32(attention_rows.SPLIT_KEYS),
                i32(max_splits),
                i64(result.stride(0)),
                i64(result.stride(1)),
            ),
        )
