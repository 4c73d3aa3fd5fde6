"""The KV price: bytes one token (and one block) occupies in the paged pool, over all layers.

The sum of every layer's cache spec (:mod:`metrale_model_arch.cache_spec`): a standard
attention layer caches K and V, an MLA layer its latent once, a linear-attention layer nothing
per token; with the paged DSA indexer, each DSA layer also stores its float32 indexer key.
"""

from __future__ import annotations

from metrale_config import ModelConfig
from metrale_model_arch.registry import cache_specs


def kv_bytes_per_token(config: ModelConfig, dtype_bytes: int, *, indexer_paged: bool) -> int:
    """Bytes one token occupies across every layer's cache at ``dtype_bytes`` per value."""
    specs = cache_specs(config, indexer_paged=indexer_paged)
    return sum(spec.paged_bytes_per_token(dtype_bytes) for spec in specs)


def kv_bytes_per_block(
    config: ModelConfig, dtype_bytes: int, block_size: int, *, indexer_paged: bool
) -> int:
    return block_size * kv_bytes_per_token(config, dtype_bytes, indexer_paged=indexer_paged)
