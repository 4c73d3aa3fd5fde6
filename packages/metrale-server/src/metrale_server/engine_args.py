"""``EngineArgs``: the engine's shape (model, pool, batch limits), named as the CLI names them."""

from __future__ import annotations

import attrs

DEFAULT_KV_CACHE_BYTES = 4 * 2**30


@attrs.frozen(kw_only=True)
class EngineArgs:
    """Engine settings; ``None`` means "derive from the model".

    ``max_seq_len`` defaults to the model's context; ``num_kv_blocks`` to enough blocks for
    ``max_batch_size`` full-length sequences, capped at ``DEFAULT_KV_CACHE_BYTES`` of K/V but
    never below one full-length sequence.
    """

    model: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    max_seq_len: int | None = None
    max_batch_size: int = 8
    max_batch_tokens: int = 2048
    num_kv_blocks: int | None = None
    enable_prefix_caching: bool = False
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        for name in ("block_size", "max_batch_size", "max_batch_tokens"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name in ("max_seq_len", "num_kv_blocks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")


def default_num_kv_blocks(
    *, max_seq_len: int, block_size: int, max_batch_size: int, kv_bytes_per_token: int
) -> int:
    blocks_per_seq = -(-max_seq_len // block_size)
    affordable = DEFAULT_KV_CACHE_BYTES // (kv_bytes_per_token * block_size)
    return max(blocks_per_seq, min(max_batch_size * blocks_per_seq, affordable))
