"""The KV price: bytes one token (and one block) occupies in the paged pool, over all layers.

The sum of every layer's cache spec (:mod:`metrale_model_arch.cache_spec`): a standard
attention layer caches K and V, an MLA layer its latent once, a linear-attention layer nothing
per token; with the paged DSA indexer, each DSA layer also stores its float32 indexer key.
"""

from __future__ import annotations

from metrale_config import ModelConfig
from metrale_model_arch.kv_cache_dtype import KvCacheDtype
from metrale_model_arch.registry import cache_specs
from metrale_model_arch.sliding_window_ring import RingLayout


def kv_bytes_per_token(
    config: ModelConfig,
    dtype_bytes: int,
    *,
    indexer_paged: bool,
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO,
    ring: RingLayout | None = None,
) -> int:
    """Bytes one token occupies across every layer's cache at ``dtype_bytes`` per value (K/V
    layers stored as ``kv_cache_dtype``; with ``ring``, the layers held in a ring per sequence
    cost nothing per token)."""
    specs = cache_specs(
        config, indexer_paged=indexer_paged, kv_cache_dtype=kv_cache_dtype, ring=ring
    )
    return sum(spec.paged_bytes_per_token(dtype_bytes) for spec in specs)


def kv_bytes_per_block(
    config: ModelConfig,
    dtype_bytes: int,
    block_size: int,
    *,
    indexer_paged: bool,
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO,
) -> int:
    per_token = kv_bytes_per_token(
        config, dtype_bytes, indexer_paged=indexer_paged, kv_cache_dtype=kv_cache_dtype
    )
    return block_size * per_token
