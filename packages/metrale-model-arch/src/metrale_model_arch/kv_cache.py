"""The paged KV cache: one tensor for every layer, and its price per token."""

from __future__ import annotations

import torch

from metrale_config import ModelConfig
from metrale_model_arch.allocator import TensorAllocator, plain_allocator
from metrale_model_arch.families import KvCache
from metrale_model_arch.memory.kv_price import kv_bytes_per_token
from metrale_model_arch.memory.plan import KV_POOL


def kv_cache_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V one token occupies across all layers (``memory.kv_bytes_per_token``)."""
    return kv_bytes_per_token(config, dtype.itemsize, indexer_paged=False)


def allocate_kv_cache(
    config: ModelConfig,
    *,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    allocator: TensorAllocator = plain_allocator,
) -> list[KvCache]:
    """One ``(k_cache, v_cache)`` per layer, each ``(num_blocks, block_size, kv_heads, head_dim)``.

    All are views of a single zeroed tensor ``(2, layers, num_blocks, block_size, kv_heads,
    head_dim)`` allocated once (from ``allocator``, owner ``kv_pool``); zeroed so a slot that
    was never written holds finite values.
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
    kv = allocator(KV_POOL, shape, dtype, torch.device(device)).zero_()
    return [(kv[0, layer], kv[1, layer]) for layer in range(config.num_hidden_layers)]
