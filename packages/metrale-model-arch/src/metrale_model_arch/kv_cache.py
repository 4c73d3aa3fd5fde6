"""The paged KV cache: one tensor for every layer, and its price per token."""

from __future__ import annotations

import torch

from metrale_config import ModelConfig
from metrale_model_arch.families import KvCache


def kv_cache_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V one token occupies across all layers."""
    values_per_layer = 2 * config.num_key_value_heads * config.head_dim
    return config.num_hidden_layers * values_per_layer * dtype.itemsize


def allocate_kv_cache(
    config: ModelConfig,
    *,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[KvCache]:
    """One ``(k_cache, v_cache)`` per layer, each ``(num_blocks, block_size, kv_heads, head_dim)``.

    All are views of a single zeroed tensor ``(2, layers, num_blocks, block_size, kv_heads,
    head_dim)`` allocated once; zeroed so a slot that was never written holds finite values.
    """
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be > 0")
    shape = (
        2,
        config.num_hidden_layers,
        num_blocks,
        block_size,
        config.num_key_value_heads,
        config.head_dim,
    )
    kv = torch.zeros(shape, dtype=dtype, device=device)
    return [(kv[0, layer], kv[1, layer]) for layer in range(config.num_hidden_layers)]
