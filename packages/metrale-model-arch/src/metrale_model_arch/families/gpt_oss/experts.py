"""gpt-oss's MoE block: a router with a bias whose top-k logits are softmaxed into the weights,
and experts with biases whose SwiGLU is clamped and shifted (the backend's ``fused_moe`` with
``activation="swigluoai"``).

The experts keep transformers' layout: ``gate_up_proj (experts, hidden, 2 * inter)`` with the
gate and up columns interleaved (gate at even columns, up at odd), ``down_proj (experts,
inter, hidden)``, multiplied from the left (``x @ w + b``); ``fused_moe`` reads them through
transposed views.
"""

from __future__ import annotations

import torch
from torch import nn

from metrale_config import ModelConfig, MoeConfig
from metrale_kernels import KernelBackend
from metrale_kernels.reference.moe_experts import SWIGLUOAI
from metrale_kernels.reference.ranked import top_k_lower_index_first


class TopKRouter(nn.Module):
    """The router's weight and bias, loaded and applied in float32."""

    def __init__(self, hidden_size: int, moe: MoeConfig) -> None:
        super().__init__()
        self.top_k = moe.num_experts_per_tok
        self.weight = nn.Parameter(torch.empty(moe.num_experts, hidden_size))
        self.bias = nn.Parameter(torch.empty(moe.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x (tokens, hidden)`` -> ``(tokens, top_k)`` float32 weights and int64 expert ids."""
        logits = torch.nn.functional.linear(x.float(), self.weight.float(), self.bias.float())
        top_logits, ids = top_k_lower_index_first(logits, self.top_k)
        return top_logits.softmax(dim=-1), ids


class BiasedExperts(nn.Module):
    def __init__(self, config: ModelConfig, moe: MoeConfig, backend: KernelBackend) -> None:
        super().__init__()
        hidden, inter, num_experts = config.hidden_size, moe.moe_intermediate_size, moe.num_experts
        assert config.swiglu_alpha is not None
        assert config.swiglu_limit is not None
        self.alpha, self.limit = config.swiglu_alpha, config.swiglu_limit
        self.backend = backend
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden, 2 * inter))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * inter))
        self.down_proj = nn.Parameter(torch.empty(num_experts, inter, hidden))
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden))

    def forward(
        self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """``sum_k weights[t, k] * expert_{ids[t, k]}(hidden[t])``, summed in float32 in
        expert order (a token's sum does not depend on the other tokens of the step)."""
        return self.backend.fused_moe(
            hidden,
            self.gate_up_proj.transpose(1, 2),
            self.down_proj.transpose(1, 2),
            weights,
            ids,
            activation=SWIGLUOAI,
            swiglu_limit=self.limit,
            swiglu_alpha=self.alpha,
            gate_up_bias=self.gate_up_proj_bias,
            down_bias=self.down_proj_bias,
        )


class GptOssMoeBlock(nn.Module):
    def __init__(self, config: ModelConfig, moe: MoeConfig, backend: KernelBackend) -> None:
        super().__init__()
        self.router = TopKRouter(config.hidden_size, moe)
        self.experts = BiasedExperts(config, moe, backend)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, ids = self.router(hidden)
        out: torch.Tensor = self.experts(hidden, weights, ids)
        return out
