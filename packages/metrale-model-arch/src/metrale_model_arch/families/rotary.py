"""The RoPE cos/sin tables a config asks for, built once per model (stacked as
:mod:`metrale_model_arch.rope_layout` lays them out)."""

from __future__ import annotations

import math

import attrs
import torch

from metrale_config import ModelConfig
from metrale_kernels import (
    cos_sin_cache,
    default_inv_freq,
    dynamic_ntk_inv_freq,
    linear_inv_freq,
    llama3_inv_freq,
)
from metrale_model_arch.rope_layout import LONGROPE, rotary_dim

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", LONGROPE)


def rope_inv_freq(config: ModelConfig, max_positions: int) -> torch.Tensor:
    """``(rotary_dim // 2,)`` float32 inverse frequencies under ``config.rope_scaling`` (for
    LongRoPE, the short factors': see :func:`longrope_max_positions`)."""
    head_dim, base, scaling = rotary_dim(config), config.rope_theta, config.rope_scaling
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
    if scaling.rope_type == LONGROPE:
        return longrope_inv_freq(config, scaling.short_factor)
    raise ValueError(
        f"unsupported rope_type {scaling.rope_type!r} for {config.model_type}; "
        f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
    )


def longrope_inv_freq(config: ModelConfig, factors: tuple[float, ...]) -> torch.Tensor:
    """LongRoPE (Phi-3): each default frequency divided by its factor."""
    dim = rotary_dim(config)
    if len(factors) != dim // 2:
        raise ValueError(
            f"{config.source}: longrope needs {dim // 2} short and long factors, got {len(factors)}"
        )
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    return 1.0 / (torch.tensor(factors, dtype=torch.float32) * config.rope_theta**exponents)


def longrope_max_positions(config: ModelConfig) -> int | None:
    """The longest context a LongRoPE model runs here (its original one), else ``None``.

    NOTE: transformers turns every position with the long factors once a sequence passes
    ``original_max_position_embeddings``, recomputing the cache it built with the short ones
    (``Phi3ForCausalLM.prepare_inputs_for_generation``). Until the engine can recompute a
    sequence at that point, a LongRoPE model serves within its original context only.
    """
    scaling = config.rope_scaling
    if scaling is None or scaling.rope_type != LONGROPE:
        return None
    return scaling.original_max_position_embeddings or config.max_position_embeddings


def longrope_attention_factor(config: ModelConfig) -> float:
    """The cos/sin scale LongRoPE applies (transformers' default from ``factor``)."""
    scaling = config.rope_scaling
    if scaling is None or scaling.rope_type != LONGROPE:
        return 1.0
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    original = scaling.original_max_position_embeddings or config.max_position_embeddings
    if scaling.factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(scaling.factor) / math.log(original))


def rope_cos_sin_table(config: ModelConfig, max_positions: int) -> torch.Tensor:
    """``(tables * max_positions, rotary_dim)`` float32 on the CPU: cos, then sin (the
    backend's layout); table ``i`` is rows ``i * max_positions`` on (``rope_layout``)."""
    # An explicit device, so a model constructed under ``torch.device("meta")`` still gets values.
    with torch.device("cpu"):
        table = cos_sin_cache(rope_inv_freq(config, max_positions), max_positions)
        scale = longrope_attention_factor(config)
        if scale != 1.0:
            table = table * scale
        if config.local_rope_theta is None:
            return table
        local = attrs.evolve(config, rope_theta=config.local_rope_theta, rope_scaling=None)
        return torch.cat([table, cos_sin_cache(rope_inv_freq(local, max_positions), max_positions)])
