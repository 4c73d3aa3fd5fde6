"""Rotary embedding tables: inverse frequencies for each scaling rule, precomputed cos/sin."""

from __future__ import annotations

import math

import torch


def default_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (base**exponents)


def llama3_inv_freq(
    head_dim: int,
    base: float,
    *,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths divided by ``factor``, a smooth blend in between."""
    inv_freq = default_inv_freq(head_dim, base)
    low_freq_wavelen = original_max_position_embeddings / low_freq_factor
    high_freq_wavelen = original_max_position_embeddings / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


def dynamic_ntk_inv_freq(
    head_dim: int,
    base: float,
    *,
    factor: float,
    original_max_position_embeddings: int,
    max_positions: int,
) -> torch.Tensor:
    """Dynamic NTK scaling, fixed for a context of ``max_positions`` tokens.

    NOTE: HF rescales per forward from the current length; a paged cache holds keys rotated
    once, so the table is built for the served context: unscaled while it fits the original
    window (identical to HF there), otherwise scaled as HF would at ``max_positions``.
    """
    if max_positions <= original_max_position_embeddings:
        return default_inv_freq(head_dim, base)
    ratio = factor * max_positions / original_max_position_embeddings - (factor - 1)
    scaled_base = base * ratio ** (head_dim / (head_dim - 2))
    return default_inv_freq(head_dim, scaled_base)


def linear_inv_freq(head_dim: int, base: float, *, factor: float) -> torch.Tensor:
    """Position interpolation: every frequency divided by ``factor``."""
    return default_inv_freq(head_dim, base) / factor


def cos_sin_cache(inv_freq: torch.Tensor, max_positions: int) -> torch.Tensor:
    """``(max_positions, 2 * len(inv_freq))``: cos of each angle, then sin."""
    positions = torch.arange(max_positions, dtype=torch.int64).to(torch.float32)
    freqs = torch.outer(positions, inv_freq.to(torch.float32))
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)
