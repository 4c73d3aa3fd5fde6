"""Reference per-token ops: RMSNorm, SiLU-and-mul, rotary embedding."""

from __future__ import annotations

import torch
from torch.nn import functional

from metrale_kernels.compute_dtype import widened


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    x32 = widened(x)
    normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    if out is None:
        return weight * normed.to(x.dtype)
    return torch.mul(weight, normed.to(x.dtype), out=out)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    summed = x + residual
    return rms_norm(summed, weight, eps), summed


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    if out is None:
        return functional.silu(gate) * up
    return torch.mul(functional.silu(gate), up, out=out)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos_half, sin_half = cos_sin_cache[positions].chunk(2, dim=-1)
    # (tokens, 1, head_dim): one angle per position, shared by every head.
    cos = torch.cat([cos_half, cos_half], dim=-1).unsqueeze(1)
    sin = torch.cat([sin_half, sin_half], dim=-1).unsqueeze(1)
    q_rotated = _rotate(q, cos.to(q.dtype), sin.to(q.dtype))
    return q_rotated, _rotate(k, cos.to(k.dtype), sin.to(k.dtype))
