"""GLM-5.3's DSA indexer cache: its capacity and bytes.

The indexer keeps, per cached token, an ``index_head_dim`` float32 key (4 bytes each; 8 at a
float64 serve, ``dtype_bytes`` below being the serve dtype's) and one byte of scale/flag; keys
are pooled ``index_kpool`` tokens at a time, so capacity is rounded down to whole pools (the
allocation holds exactly that many tokens). The specs
(:class:`~metrale_model_arch.cache_spec.FlatIndexerSpec`,
:class:`~metrale_model_arch.cache_spec.PagedIndexerSpec`) hold the same layout.
"""

from __future__ import annotations

from metrale_model_arch.cache_spec import (
    FLOAT32_BYTES,
    FlatIndexerSpec,
    PagedIndexerSpec,
    dsa_capacity,
)
from metrale_model_arch.owners import PER_SEQUENCE_STATE

__all__ = ["dsa_capacity", "indexer_state_bytes", "paged_indexer_bytes_per_token"]


def indexer_state_bytes(
    capacity: int, index_head_dim: int, dtype_bytes: int = FLOAT32_BYTES
) -> int:
    """Bytes of one layer's flat indexer cache holding ``capacity`` tokens."""
    spec = FlatIndexerSpec(index_head_dim=index_head_dim, index_kpool=1)
    return spec.state_bytes_per_slot(PER_SEQUENCE_STATE, capacity, dtype_bytes)


def paged_indexer_bytes_per_token(index_head_dim: int, dtype_bytes: int = FLOAT32_BYTES) -> int:
    """What the paged indexer adds to one DSA layer's KV price per token."""
    return PagedIndexerSpec(index_head_dim=index_head_dim).paged_bytes_per_token(dtype_bytes)
