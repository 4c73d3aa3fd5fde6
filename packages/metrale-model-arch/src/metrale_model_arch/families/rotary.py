"""The RoPE cos/sin table a config asks for, built once per model."""

from __future__ import annotations

import torch

from metrale_config import ModelConfig
from metrale_kernels import (
    cos_sin_cache,
    default_inv_freq,
    dynamic_ntk_inv_freq,
    linear_inv_freq,
    llama3_inv_freq,
)

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3")


def rope_inv_freq(config: ModelConfig, max_positions: int) -> torch.Tensor:
    """``(head_dim // 2,)`` float32 inverse frequencies under ``config.rope_scaling``."""
    head_dim, base, scaling = config.head_dim, config.rope_theta, config.rope_scaling
    if scaling is None or scaling.rope_type == "default":
        return default_inv_freq(head_dim, base)
    original_max = scaling.original_max_position_embeddings
    if scaling.rope_type == "linear":
        return linear_inv_freq(head_dim, base, factor=scaling.factor)
    if scaling.rope_type == "dynamic":
        return dynamic_ntk_inv_freq(
            head_dim,
            base,
            factor=scaling.factor,
            original_max_position_embeddings=original_max or config.max_position_embeddings,
            max_positions=max_positions,
        )
    if scaling.rope_type == "llama3":
        if scaling.low_freq_factor is None or scaling.high_freq_factor is None or not original_max:
            raise ValueError(
                "rope_type 'llama3' needs low_freq_factor, high_freq_factor and "
                "original_max_position_embeddings"
            )
        return llama3_inv_freq(
            head_dim,
            base,
            factor=scaling.factor,
            low_freq_factor=scaling.low_freq_factor,
            high_freq_factor=scaling.high_freq_factor,
            original_max_position_embeddings=original_max,
        )
    raise ValueError(
        f"unsupported rope_type {scaling.rope_type!r} for {config.model_type}; "
        f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
    )


def rope_cos_sin_table(config: ModelConfig, max_positions: int) -> torch.Tensor:
    """``(max_positions, head_dim)`` float32 on the CPU: cos, then sin (the backend's layout)."""
    # An explicit device, so a model constructed under ``torch.device("meta")`` still gets values.
    with torch.device("cpu"):
        return cos_sin_cache(rope_inv_freq(config, max_positions), max_positions)
