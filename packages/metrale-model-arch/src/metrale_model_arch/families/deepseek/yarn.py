"""DeepSeek's RoPE table and softmax scale, YaRN included (transformers' ``yarn`` rope type).

YaRN blends each frequency between its extrapolated value (the default) and its interpolated
one (divided by ``factor``) along a ramp over the rotary dims set by ``beta_fast`` /
``beta_slow``, and scales cos and sin by an attention factor. DeepSeek's MLA also scales the
softmax by ``mscale(factor, mscale_all_dim) ** 2``, on every dim, RoPE or not.
"""

from __future__ import annotations

import math

import torch

from metrale_config import ModelConfig, RopeScaling
from metrale_kernels import cos_sin_cache
from metrale_model_arch.families.rotary import rope_cos_sin_table
from metrale_model_arch.rope_layout import rotary_dim

YARN = "yarn"
DEFAULT_BETA_FAST = 32.0
DEFAULT_BETA_SLOW = 1.0


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(factor) + 1`` (1 when not stretched)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_attention_factor(scaling: RopeScaling) -> float:
    """The cos/sin scale: ``attention_factor`` when set, else ``mscale / mscale_all_dim``'s
    ratio when both are set, else ``yarn_mscale(factor)``."""
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    if scaling.mscale and scaling.mscale_all_dim:
        return yarn_mscale(scaling.factor, scaling.mscale) / yarn_mscale(
            scaling.factor, scaling.mscale_all_dim
        )
    return yarn_mscale(scaling.factor)


def yarn_inv_freq(dim: int, base: float, scaling: RopeScaling) -> torch.Tensor:
    """``(dim // 2,)`` float32 inverse frequencies under YaRN."""
    original = scaling.original_max_position_embeddings
    if not original:
        raise ValueError("rope_type 'yarn' needs original_max_position_embeddings")

    def correction_dim(num_rotations: float) -> float:
        return dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = correction_dim(scaling.beta_fast or DEFAULT_BETA_FAST)
    high = correction_dim(scaling.beta_slow or DEFAULT_BETA_SLOW)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim)
    extrapolated = 1 - ramp
    return (1.0 / (scaling.factor * pos_freqs)) * ramp + (1.0 / pos_freqs) * extrapolated


def deepseek_cos_sin_table(config: ModelConfig, max_positions: int) -> torch.Tensor:
    """``(max_positions, qk_rope_head_dim)`` float32 on the CPU: cos, then sin."""
    scaling = config.rope_scaling
    if scaling is None or scaling.rope_type != YARN:
        return rope_cos_sin_table(config, max_positions)
    with torch.device("cpu"):
        inv_freq = yarn_inv_freq(rotary_dim(config), config.rope_theta, scaling)
        return cos_sin_cache(inv_freq, max_positions) * yarn_attention_factor(scaling)


def mla_softmax_scale(config: ModelConfig) -> float:
    """``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``, times ``mscale(factor,
    mscale_all_dim) ** 2`` under a rope scaling that sets ``mscale_all_dim``."""
    scale: float = config.head_dim**-0.5
    scaling = config.rope_scaling
    if scaling is not None and scaling.mscale_all_dim:
        scale *= yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2
    return scale
