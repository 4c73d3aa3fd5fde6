"""Gated DeltaNet (Qwen3-Next's linear attention): the gated delta rule with one forget gate
per value head, run by the KDA ops with that gate broadcast over the key dim.

Per sequence the layer keeps a float32 recurrent state ``(value heads, key dim, value dim)``
and the last ``conv_kernel_dim - 1`` inputs of its short convolution over q | k | v, in the
linear-state pool slot of the sequence (``metadata.state_slots``), as KDA does
(:mod:`~metrale_model_arch.families.glm5_next.kda_attention`). q and k have fewer heads than v:
each serves ``num_heads // num_key_heads`` consecutive value heads.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from metrale_config import LinearAttentionConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_kernels.row_invariant import pointwise_rows
from metrale_model_arch.families.delta_rule_step import delta_rule_over_slots
from metrale_model_arch.families.glm5_next.kda_attention import L2_NORM_EPS


class GatedRMSNorm(nn.Module):
    """RMSNorm over each value head, scaled by ``weight`` and gated by ``silu(z)``."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)).to(x.dtype)
        return (self.weight * normed * functional.silu(z.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        linear: LinearAttentionConfig,
        rms_norm_eps: float,
        backend: KernelBackend,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_key_heads = linear.num_heads, linear.num_key_heads
        self.key_dim, self.value_dim = linear.head_dim, linear.value_head_dim
        self.group = self.num_heads // self.num_key_heads
        self.backend = backend
        key_width = self.num_key_heads * self.key_dim
        value_width = self.num_heads * self.value_dim
        self.conv_split = (key_width, key_width, value_width)
        # Per key head: q (key dim), k (key dim), then v and z of its group of value heads.
        self.in_proj_qkvz = nn.Linear(hidden_size, 2 * key_width + 2 * value_width, bias=False)
        # Per key head: b, then a, of its group of value heads.
        self.in_proj_ba = nn.Linear(hidden_size, 2 * self.num_heads, bias=False)
        channels = sum(self.conv_split)
        kernel = linear.conv_kernel_dim
        self.conv1d = nn.Conv1d(channels, channels, kernel, groups=channels, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_heads))
        self.norm = GatedRMSNorm(self.value_dim, rms_norm_eps)
        self.out_proj = nn.Linear(value_width, hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, state: tuple[torch.Tensor, ...], metadata: AttentionMetadata
    ) -> torch.Tensor:
        """Normed ``x (tokens, hidden)`` -> ``(tokens, hidden)``; ``state`` is the layer's
        ``(recurrent (slots, H, dk, dv), conv (slots, channels, K - 1))``, updated in place."""
        mixed, z, b, a = self._project(x)
        # (tokens, H, 1) log-decay, one per value head; (tokens, H) update strength.
        decay = pointwise_rows(functional.softplus, a.float() + self.dt_bias)
        g = (-self.A_log.float().exp() * decay).unsqueeze(-1)
        beta = pointwise_rows(torch.sigmoid, b).float()
        weight = self.conv1d.weight.float().squeeze(1)
        out = delta_rule_over_slots(
            self.backend, mixed, weight, g, beta, state, metadata, self._split
        )
        gated = self.norm(out.to(x.dtype), z)
        projected: torch.Tensor = self.out_proj(gated.flatten(1))
        return projected

    def _project(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x (tokens, hidden)`` -> the conv input q | k | v ``(tokens, channels)``, the output
        gate ``z (tokens, H, dv)``, ``b`` and ``a (tokens, H)``."""
        tokens, group_width = x.shape[0], self.group * self.value_dim
        per_key_head = self.in_proj_qkvz(x).view(tokens, self.num_key_heads, -1)
        q, k, v, z = per_key_head.split(
            (self.key_dim, self.key_dim, group_width, group_width), dim=-1
        )
        b, a = self.in_proj_ba(x).view(tokens, self.num_key_heads, -1).split(self.group, dim=-1)
        mixed = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=-1)
        z = z.reshape(tokens, self.num_heads, self.value_dim)
        return mixed, z, b.reshape(tokens, -1), a.reshape(tokens, -1)

    def _split(self, conv_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Convolved ``(tokens, channels)`` float32 -> q (L2-normalized, scaled) and k
        (L2-normalized), each repeated to ``(tokens, H, dk)``; v ``(tokens, H, dv)``."""
        tokens = conv_out.shape[0]
        q, k, v = torch.split(conv_out, list(self.conv_split), dim=-1)
        q, k = (
            t.reshape(tokens, self.num_key_heads, self.key_dim).repeat_interleave(self.group, 1)
            for t in (q, k)
        )
        q = q * torch.rsqrt(q.pow(2).sum(dim=-1, keepdim=True) + L2_NORM_EPS) * self.key_dim**-0.5
        k = k * torch.rsqrt(k.pow(2).sum(dim=-1, keepdim=True) + L2_NORM_EPS)
        return q, k, v.reshape(tokens, self.num_heads, self.value_dim)
