"""GLM-5.3's feed-forward blocks: a clamped SwiGLU MLP, and the DeepSeek-V3-style MoE.

The clamped SwiGLU caps the gate from above and the up projection on both sides at
``swiglu_limit``. The MoE routes by sigmoid scores plus a float32 correction bias (used only to
choose), group-limited, with the unbiased scores as weights (renormalized with
``norm_topk_prob``, times ``routed_scaling_factor``), and adds its shared experts.
"""

from __future__ import annotations

import torch
from torch import nn

from metrale_config import ModelConfig, MoeConfig
from metrale_kernels import KernelBackend, widened
from metrale_kernels.reference.moe_experts import swiglu
from metrale_model_arch.families.moe import StackedExperts


class ClampedSwiGluMlp(nn.Module):
    def __init__(
        self, hidden_size: int, intermediate_size: int, limit: float | None, *, bias: bool = False
    ) -> None:
        super().__init__()
        # gate rows, then up rows.
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(swiglu(self.gate_up_proj(x), self.limit))
        return out


class Router(nn.Module):
    """The router's float32 weight and score-correction bias (both loaded, both float32)."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.empty(num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = widened(x)
        return wide @ self.weight.to(wide.dtype).t()


class GlmMoeBlock(nn.Module):
    def __init__(self, config: ModelConfig, moe: MoeConfig, backend: KernelBackend) -> None:
        super().__init__()
        self.moe = moe
        self.limit = config.swiglu_limit
        self.backend = backend
        self.gate = Router(config.hidden_size, moe.num_experts)
        self.experts = StackedExperts(config.hidden_size, moe)
        self.shared_experts: ClampedSwiGluMlp | None = None
        if moe.num_shared_experts > 0:
            size = moe.moe_intermediate_size * moe.num_shared_experts
            self.shared_experts = ClampedSwiGluMlp(config.hidden_size, size, self.limit)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        moe = self.moe
        weights, ids = self.backend.grouped_sigmoid_topk_routing(
            self.gate(hidden),
            self.gate.e_score_correction_bias,
            moe.num_experts_per_tok,
            num_groups=moe.n_group,
            topk_groups=moe.topk_group,
            renormalize=moe.norm_topk_prob,
            routed_scaling_factor=moe.routed_scaling_factor,
        )
        out = self.backend.fused_moe(
            hidden,
            self.experts.gate_up_proj,
            self.experts.down_proj,
            weights,
            ids,
            swiglu_limit=self.limit,
        )
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden)
        return out
