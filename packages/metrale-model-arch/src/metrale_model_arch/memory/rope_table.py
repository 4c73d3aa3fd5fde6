"""The RoPE cos/sin tables a rotary family precomputes: ``(tables * max_seq_len, rotary_dim)``
float32 (:mod:`metrale_model_arch.rope_layout`)."""

from __future__ import annotations

from metrale_config import ModelConfig
from metrale_model_arch.rope_layout import num_rope_tables, rotary_dim

FLOAT32_BYTES = 4


def rope_table_bytes(config: ModelConfig, max_seq_len: int) -> int:
    """Zero for a model without RoPE (GLM-5.3's MLA has ``qk_rope_head_dim == 0``)."""
    return num_rope_tables(config) * max_seq_len * rotary_dim(config) * FLOAT32_BYTES
