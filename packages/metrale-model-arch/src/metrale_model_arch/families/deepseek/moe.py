"""DeepSeek-V2's MoE block: softmax routing, greedy or group-limited, over stacked experts,
plus shared experts on every token. (V3 routes like GLM:
:class:`~metrale_model_arch.families.glm5_next.mlp.GlmMoeBlock`, unclamped.)"""

from __future__ import annotations

import torch
from torch import nn

from metrale_config import ModelConfig, MoeConfig
from metrale_kernels import KernelBackend
from metrale_model_arch.families.llama import LlamaMLP
from metrale_model_arch.families.moe import StackedExperts


class SoftmaxRouter(nn.Module):
    """The router's weight, loaded and applied in float32."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() @ self.weight.float().t()


class DeepseekV2MoeBlock(nn.Module):
    def __init__(self, config: ModelConfig, moe: MoeConfig, backend: KernelBackend) -> None:
        super().__init__()
        self.moe = moe
        self.backend = backend
        self.gate = SoftmaxRouter(config.hidden_size, moe.num_experts)
        self.experts = StackedExperts(config.hidden_size, moe)
        self.shared_experts: LlamaMLP | None = None
        if moe.num_shared_experts > 0:
            size = moe.moe_intermediate_size * moe.num_shared_experts
            self.shared_experts = LlamaMLP(config, backend, intermediate_size=size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        moe = self.moe
        weights, ids = self.backend.grouped_softmax_topk_routing(
            self.gate(hidden),
            moe.num_experts_per_tok,
            num_groups=moe.n_group,
            topk_groups=moe.topk_group,
            routed_scaling_factor=moe.routed_scaling_factor,
        )
        out = self.backend.fused_moe(
            hidden, self.experts.gate_up_proj, self.experts.down_proj, weights, ids
        )
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden)
        return out
