"""KDA (Kimi Delta Attention): linear attention with a per-channel forget gate.

Per sequence the layer keeps a float32 (float64 at a float64 serve) recurrent state ``(heads,
head_dim, head_dim)`` and the last ``conv_kernel_dim - 1`` inputs of its short convolution, in
the linear-state pool slot of the sequence (``metadata.state_slots``). A multi-token chunk runs
the chunked form from the slot's state, a decode step the recurrent form for every sequence at
once; both write the new state back, so a prompt split into chunks continues where the last
chunk stopped.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from metrale_config import LinearAttentionConfig
from metrale_kernels import AttentionMetadata, KernelBackend, compute_dtype, widened
from metrale_model_arch.families.delta_rule_step import delta_rule_over_slots

# Inside the square root of the q/k L2 normalisation.
L2_NORM_EPS = 1e-6


class ForgetGate(nn.Module):
    """Per head and channel log-decay ``g <= 0`` from a rank-``head_dim`` projection.
    ``A_log`` holds one value a head, in ``a_log_shape`` (a checkpoint's: Kimi Linear's
    ``(1, 1, heads, 1)``), ``(heads,)`` by default."""

    def __init__(
        self,
        hidden_size: int,
        linear: LinearAttentionConfig,
        a_log_shape: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__()
        heads, head_dim = linear.num_heads, linear.head_dim
        self.num_heads, self.head_dim = heads, head_dim
        self.lower_bound = linear.lower_bound
        self.f_a_proj = nn.Linear(hidden_size, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, heads * head_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(heads * head_dim))
        self.A_log = nn.Parameter(torch.empty(a_log_shape or (heads,)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (tokens, hidden)`` -> ``g (tokens, heads, head_dim)`` float32 (compute dtype)."""
        f = widened(self.f_b_proj(self.f_a_proj(x)))
        f = (f + self.dt_bias.to(f.dtype)).view(-1, self.num_heads, self.head_dim)
        rate = self.A_log.to(f.dtype).exp().view(-1, 1)
        if self.lower_bound is None:
            return -rate * functional.softplus(f)
        return self.lower_bound * torch.sigmoid(rate * f)


class KdaAttention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        linear: LinearAttentionConfig,
        rms_norm_eps: float,
        backend: KernelBackend,
        a_log_shape: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__()
        heads, head_dim = linear.num_heads, linear.head_dim
        width = heads * head_dim
        self.num_heads, self.head_dim, self.width = heads, head_dim, width
        self.rms_norm_eps = rms_norm_eps
        self.backend = backend
        self.q_proj = nn.Linear(hidden_size, width, bias=False)
        self.k_proj = nn.Linear(hidden_size, width, bias=False)
        self.v_proj = nn.Linear(hidden_size, width, bias=False)
        # Depthwise, no bias: channels q | k | v, one row of ``conv_kernel_dim`` taps each.
        self.conv1d = nn.Parameter(torch.empty(3 * width, 1, linear.conv_kernel_dim))
        self.forget_gate = ForgetGate(hidden_size, linear, a_log_shape)
        self.b_proj = nn.Linear(hidden_size, heads, bias=False)
        self.g_a_proj = nn.Linear(hidden_size, head_dim, bias=False)
        self.g_b_proj = nn.Linear(head_dim, width, bias=False)
        self.o_norm = nn.Parameter(torch.empty(head_dim))
        self.o_proj = nn.Linear(width, hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, state: tuple[torch.Tensor, ...], metadata: AttentionMetadata
    ) -> torch.Tensor:
        """Normed ``x (tokens, hidden)`` -> ``(tokens, hidden)``; ``state`` is the layer's
        ``(recurrent (slots, H, d, d), conv (slots, 3 * H * d, K - 1))``, updated in place."""
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        g = self.forget_gate(x)
        beta = widened(torch.sigmoid(self.b_proj(x)))
        weight = self.conv1d.to(compute_dtype(x.dtype)).squeeze(1)
        out = delta_rule_over_slots(
            self.backend, mixed, weight, g, beta, state, metadata, self._split
        )
        return self._output(x, out)

    def _split(self, conv_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Convolved ``(tokens, 3 * H * d)`` float32 -> L2-normalized, scaled q; normalized k;
        v; each ``(tokens, H, d)``."""
        shape = (conv_out.shape[0], self.num_heads, self.head_dim)
        q, k, v = (part.reshape(shape) for part in torch.split(conv_out, self.width, dim=-1))
        q = q * torch.rsqrt(q.pow(2).sum(dim=-1, keepdim=True) + L2_NORM_EPS) * self.head_dim**-0.5
        k = k * torch.rsqrt(k.pow(2).sum(dim=-1, keepdim=True) + L2_NORM_EPS)
        return q, k, v

    def _output(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """Per-head RMSNorm of ``o (tokens, H, d)``, gated by ``sigmoid(g_b(g_a(x)))``, then
        projected. Norm, gate and product in float32, rounded once (transformers' and FLA's
        gated norm)."""
        normed = o * torch.rsqrt(o.pow(2).mean(dim=-1, keepdim=True) + self.rms_norm_eps)
        gate = torch.sigmoid(widened(self.g_b_proj(self.g_a_proj(x)))).view_as(normed)
        gated = normed * self.o_norm.to(normed.dtype) * gate
        out: torch.Tensor = self.o_proj(gated.to(x.dtype).flatten(1))
        return out
