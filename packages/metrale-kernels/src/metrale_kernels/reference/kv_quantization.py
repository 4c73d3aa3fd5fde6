"""A quantized K/V cache: one byte a value, and a float16 scale per (token, kv head).

A quantized cache is a K or V cache whose dtype is ``int8``, ``float8_e4m3fn`` or
``float8_e5m2``, shaped ``(num_blocks, block_size, kv_heads, head_dim + SCALE_BYTES)``: each
(token, head) row holds its ``head_dim`` quantized values and then the two bytes of its float16
scale, so the scale travels with its values (one gather reads both) and every op that takes a
cache takes a quantized one unchanged. A row's value ``x`` is stored as ``x / scale`` (rounded
to the nearest int8, or cast to fp8), ``scale = amax(|row|) / QMAX`` in float16, and read back
as ``float(stored) * float(scale)``: the native kernels compute exactly these numbers.
"""

from __future__ import annotations

import torch

SCALE_BYTES = 2  # a float16 scale, stored as two bytes of the cache's dtype

# The stored magnitude a row's amax maps to: the format's largest, but for e5m2, whose largest
# (57344) would put a small row's float16 scale among the subnormals; e4m3's 448 leaves e5m2
# its range below.
QMAX: dict[torch.dtype, float] = {
    torch.int8: 127.0,
    torch.float8_e4m3fn: 448.0,
    torch.float8_e5m2: 448.0,
}


def is_quantized_dtype(dtype: torch.dtype) -> bool:
    return dtype in QMAX


def is_quantized_cache(cache: torch.Tensor) -> bool:
    return is_quantized_dtype(cache.dtype)


def cache_head_dim(cache: torch.Tensor) -> int:
    """The head dim a cache stores: its last dim, less the scale bytes when quantized."""
    return cache.shape[-1] - SCALE_BYTES if is_quantized_cache(cache) else cache.shape[-1]


def quantize_kv(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x (..., head_dim)`` as quantized rows ``(..., head_dim + SCALE_BYTES)`` of ``dtype``."""
    qmax = QMAX[dtype]
    values = x.to(torch.float32)
    amax = values.abs().amax(-1, keepdim=True)
    # Divided by a tensor: CUDA divides a tensor by a Python scalar as a product with its
    # reciprocal, which rounds differently (the kernels divide).
    scale = (amax / torch.full_like(amax, qmax)).to(torch.float16)
    divisor = scale.to(torch.float32)
    divisor = torch.where(divisor > 0, divisor, torch.ones_like(divisor))
    scaled = (values / divisor).clamp_(-qmax, qmax)
    quantized = scaled.round_().to(dtype) if dtype == torch.int8 else scaled.to(dtype)
    return torch.cat((quantized.view(torch.uint8), scale.view(torch.uint8)), -1).view(dtype)


def dequantize_kv(rows: torch.Tensor) -> torch.Tensor:
    """Quantized rows ``(..., head_dim + SCALE_BYTES)`` as float32 ``(..., head_dim)``; any
    other cache's rows as they are."""
    if not is_quantized_cache(rows):
        return rows
    head_dim = rows.shape[-1] - SCALE_BYTES
    scale = rows[..., head_dim:].contiguous().view(torch.float16).to(torch.float32)
    return rows[..., :head_dim].to(torch.float32) * scale


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """Blocks ``block_ids`` of ``cache``, dequantized to float32 when it is quantized."""
    if not is_quantized_cache(cache):
        return cache.index_select(0, block_ids)
    # (Gathered as bytes: torch has no index_select for fp8.)
    return dequantize_kv(cache.view(torch.uint8).index_select(0, block_ids).view(cache.dtype))


def write_slots(cache: torch.Tensor, slot_mapping: torch.Tensor, rows: torch.Tensor) -> None:
    """``rows (tokens, kv_heads, head_dim)`` into slots ``slot_mapping`` of ``cache``,
    quantized when it is."""
    slots = cache.view(-1, *cache.shape[-2:])
    if not is_quantized_cache(cache):
        slots.index_copy_(0, slot_mapping, rows.to(cache.dtype))
        return
    quantized = quantize_kv(rows, cache.dtype)
    slots.view(torch.uint8).index_copy_(0, slot_mapping, quantized.view(torch.uint8))
