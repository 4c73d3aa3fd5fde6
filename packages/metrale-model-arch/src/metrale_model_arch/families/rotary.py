"""The RoPE cos/sin tables a config asks for, built once per model (stacked as
:mod:`metrale_model_arch.rope_layout` lays them out).

YaRN (transformers' ``yarn`` rope type, for the families that take it) blends each frequency
between its extrapolated value (the default) and its interpolated one (divided by ``factor``)
along a ramp over the rotary dims set by ``beta_fast`` / ``beta_slow``, and scales cos and sin
by an attention factor.

LongRoPE (Phi-3) divides each frequency by its short or long factor, and scales cos and sin by
one attention factor either way. The serve's context chooses the factors, once for the whole
table: the long ones when ``max_positions`` (the serve's ``--max-seq-len``) passes
``original_max_position_embeddings``, else the short ones (llama.cpp's rule, from its context).

NOTE: transformers picks per forward pass: the long factors for every position once the
sequence is longer than the original context, the short ones before. Its ``generate`` recomputes
the whole cache with the long factors at the step a sequence first passes the boundary
(``Phi3ForCausalLM.prepare_inputs_for_generation``). With one table per serve, ours equals it for
every sequence longer than the original context, whether prefilled at once, in chunks, or grown
past the boundary by decoding (from the crossing on, its keys are the long-factor ones
transformers recomputes); a sequence that stays within the original context, served with a
longer ``--max-seq-len``, gets the long factors where transformers uses the short ones (serve
with ``--max-seq-len`` at most the original context for those). Choosing per step instead (vLLM
switches the whole batch to the long table when any token of it is past the boundary) would make
a sequence's logits depend on its batch-mates and on its prefill chunks, and keep the short keys
it cached before the crossing.
"""

from __future__ import annotations

import math

import attrs
import torch

from metrale_config import ModelConfig, RopeScaling
from metrale_kernels import (
    cos_sin_cache,
    default_inv_freq,
    dynamic_ntk_inv_freq,
    linear_inv_freq,
    llama3_inv_freq,
)
from metrale_model_arch.rope_layout import LONGROPE, rotary_dim

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", LONGROPE)
YARN = "yarn"
DEFAULT_BETA_FAST = 32.0
DEFAULT_BETA_SLOW = 1.0


def rope_inv_freq(config: ModelConfig, max_positions: int) -> torch.Tensor:
    """``(rotary_dim // 2,)`` float32 inverse frequencies under ``config.rope_scaling`` for a
    table of ``max_positions`` rows (for LongRoPE: :func:`longrope_factors`)."""
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
        return longrope_inv_freq(config, longrope_factors(config, max_positions))
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


def longrope_factors(config: ModelConfig, max_positions: int) -> tuple[float, ...]:
    """The long factors when a table of ``max_positions`` rows passes the original context,
    else the short ones (transformers' ``_compute_longrope_parameters`` at ``seq_len``
    ``max_positions``; this module's docstring says why one set per table)."""
    scaling = config.rope_scaling
    if scaling is None or scaling.rope_type != LONGROPE:
        raise ValueError(f"{config.source}: rope_type is not {LONGROPE!r}")
    original = scaling.original_max_position_embeddings or config.max_position_embeddings
    return scaling.long_factor if max_positions > original else scaling.short_factor


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


def rope_or_yarn_cos_sin_table(config: ModelConfig, max_positions: int) -> torch.Tensor:
    """``(max_positions, rotary_dim)`` float32 on the CPU, cos then sin: YaRN's table (scaled
    by :func:`yarn_attention_factor`) under rope type ``yarn``, else :func:`rope_cos_sin_table`'s
    (the llama family refuses YaRN: only the families that take it build this one)."""
    scaling = config.rope_scaling
    if scaling is None or scaling.rope_type != YARN:
        return rope_cos_sin_table(config, max_positions)
    with torch.device("cpu"):
        inv_freq = yarn_inv_freq(rotary_dim(config), config.rope_theta, scaling)
        return cos_sin_cache(inv_freq, max_positions) * yarn_attention_factor(scaling)
