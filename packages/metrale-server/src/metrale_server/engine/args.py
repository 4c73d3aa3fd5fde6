"""``EngineArgs``: the engine's shape (model, pool, batch limits), named as the CLI names them."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class EngineArgs:
    """Engine settings; ``None`` means "derive from the model" (or, for ``max_batch_size``,
    ``auto``: the slot count that admits the most full-length sequences).

    ``max_seq_len`` defaults to the model's context. The KV pool is what the memory plan
    leaves in ``gpu_memory_utilization`` of the device's memory, up to what ``max_batch_size``
    full-length sequences can use; ``num_kv_blocks`` fixes it instead (it must still fit).
    """

    model: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    max_seq_len: int | None = None
    max_batch_size: int | None = 8
    max_batch_tokens: int = 2048
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = False
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        for name in ("block_size", "max_batch_tokens"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name in ("max_seq_len", "num_kv_blocks", "max_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
