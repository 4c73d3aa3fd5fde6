"""GLM-5.3's DSA indexer cache: its capacity and bytes.

The indexer keeps, per cached token, an ``index_head_dim`` float32 key (4 bytes each) and one
byte of scale/flag; keys are pooled ``index_kpool`` tokens at a time, so capacity is rounded
down to whole pools (the allocation holds exactly that many tokens).
"""

from __future__ import annotations

FLOAT32_BYTES = 4


def dsa_capacity(max_seq_len: int, index_kpool: int) -> int:
    """Tokens an indexer cache holds for a ``max_seq_len`` context: whole pools only."""
    pool = max(index_kpool, 1)
    return (max_seq_len // pool) * pool


def indexer_state_bytes(capacity: int, index_head_dim: int) -> int:
    """Bytes of one layer's flat indexer cache holding ``capacity`` tokens."""
    return capacity * (FLOAT32_BYTES * index_head_dim + 1)


def paged_indexer_bytes_per_token(index_head_dim: int) -> int:
    """What the paged indexer adds to one DSA layer's KV price per token."""
    return FLOAT32_BYTES * index_head_dim
