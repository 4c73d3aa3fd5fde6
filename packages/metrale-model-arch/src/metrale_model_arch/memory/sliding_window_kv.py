"""The sliding-window K/V rings: each sequence's ring of every sliding-window layer held in one
(:mod:`metrale_model_arch.sliding_window_ring`), per slot, owner ``sliding_window_kv``.

A ringed layer costs nothing per token in the KV pool; per slot it costs its ring's
``ring_blocks x block_size`` tokens of K and V (at ``kv_cache_dtype``, as the pool would).
"""

from __future__ import annotations

from metrale_config import ModelConfig
from metrale_model_arch.kv_cache_dtype import KvCacheDtype
from metrale_model_arch.memory.state_pools import state_bytes_per_slot
from metrale_model_arch.owners import SLIDING_WINDOW_KV
from metrale_model_arch.registry import cache_specs
from metrale_model_arch.sliding_window_ring import RingLayout


def sliding_window_kv_bytes_per_slot(
    config: ModelConfig,
    dtype_bytes: int,
    ring: RingLayout,
    *,
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO,
) -> int:
    """One sequence's rings over every ringed layer."""
    specs = cache_specs(config, indexer_paged=True, kv_cache_dtype=kv_cache_dtype, ring=ring)
    return state_bytes_per_slot(specs, SLIDING_WINDOW_KV, ring.max_seq_len, dtype_bytes)


def sliding_window_kv_bytes(
    config: ModelConfig,
    max_batch_size: int,
    dtype_bytes: int,
    ring: RingLayout,
    *,
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO,
) -> int:
    """The rings of ``max_batch_size`` slots (0 counts as 1; a ring pool has no dummy slot)."""
    per_slot = sliding_window_kv_bytes_per_slot(
        config, dtype_bytes, ring, kv_cache_dtype=kv_cache_dtype
    )
    return max(max_batch_size, 1) * per_slot
