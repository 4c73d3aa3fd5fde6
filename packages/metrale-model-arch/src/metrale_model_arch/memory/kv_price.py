"""The KV price: bytes one token (and one block) occupies in the paged pool, over all layers.

A standard attention layer caches K and V, ``2 * kv_heads * head_dim`` values a token. An MLA
layer caches its compressed latent and the decoupled RoPE key once: ``kv_lora_rank +
qk_rope_head_dim`` values. A linear-attention layer caches nothing per token (its state is per
sequence, in the linear-state pool). With the paged DSA indexer, each DSA layer also stores its
indexer key in the pool: ``4 * index_head_dim`` bytes a token.
"""

from __future__ import annotations

from metrale_config import LINEAR_ATTENTION, SPARSE_ATTENTION, ModelConfig
from metrale_model_arch.memory.dsa_state import paged_indexer_bytes_per_token


def kv_values_per_token(config: ModelConfig, layer_type: str) -> int:
    """Cached values one token costs in one layer of ``layer_type``."""
    if layer_type == LINEAR_ATTENTION:
        return 0
    if config.mla is not None:
        return config.mla.kv_lora_rank + config.mla.qk_rope_head_dim
    return 2 * config.num_key_value_heads * config.head_dim


def kv_bytes_per_token(config: ModelConfig, dtype_bytes: int, *, indexer_paged: bool) -> int:
    """Bytes one token occupies across every layer's cache at ``dtype_bytes`` per value."""
    layer_types = config.layer_types or ("full_attention",) * config.num_hidden_layers
    values = sum(kv_values_per_token(config, kind) for kind in layer_types)
    total = values * dtype_bytes
    if indexer_paged and config.dsa is not None:
        num_dsa_layers = sum(1 for kind in layer_types if kind == SPARSE_ATTENTION)
        total += num_dsa_layers * paged_indexer_bytes_per_token(config.dsa.index_head_dim)
    return total


def kv_bytes_per_block(
    config: ModelConfig, dtype_bytes: int, block_size: int, *, indexer_paged: bool
) -> int:
    return block_size * kv_bytes_per_token(config, dtype_bytes, indexer_paged=indexer_paged)
