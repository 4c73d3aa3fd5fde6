"""Per-sequence state pools priced from the cache specs: bytes per slot and per pool."""

from __future__ import annotations

from collections.abc import Sequence

from metrale_model_arch.cache_spec import LayerCacheSpec


def state_bytes_per_slot(
    specs: Sequence[LayerCacheSpec], owner: str, max_seq_len: int, dtype_bytes: int
) -> int:
    """One sequence's state in pool ``owner`` over every layer."""
    return sum(spec.state_bytes_per_slot(owner, max_seq_len, dtype_bytes) for spec in specs)


def state_pool_bytes(
    specs: Sequence[LayerCacheSpec], owner: str, num_slots: int, max_seq_len: int, dtype_bytes: int
) -> int:
    """Pool ``owner`` for ``num_slots`` sequences plus its dummy slots."""
    return sum(
        tensor.bytes_per_slot(dtype_bytes) * (num_slots + tensor.num_dummy_slots)
        for spec in specs
        for tensor in spec.state(max_seq_len)
        if tensor.owner == owner
    )
