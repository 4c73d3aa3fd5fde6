"""The RoPE cos/sin table a rotary family precomputes: ``(max_seq_len, rotary_dim)`` float32."""

from __future__ import annotations

from metrale_config import ModelConfig

FLOAT32_BYTES = 4


def rope_table_bytes(config: ModelConfig, max_seq_len: int) -> int:
    """Zero for a model without RoPE (GLM-5.3's MLA has ``qk_rope_head_dim == 0``)."""
    rotary_dim = config.mla.qk_rope_head_dim if config.mla is not None else config.head_dim
    return max_seq_len * rotary_dim * FLOAT32_BYTES
