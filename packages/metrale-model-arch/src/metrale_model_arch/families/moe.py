"""The routed mixture-of-experts MLP, and the llama-family model whose layers may hold one.

A sparse layer's experts live stacked, one tensor per projection, so the backend's
``fused_moe`` runs them all in one call: ``gate_up_proj (experts, 2 * inter, hidden)`` (gate in
the first half, up in the second) and ``down_proj (experts, hidden, inter)``. The router is a
bias-free linear layer; each token goes to the ``num_experts_per_tok`` experts of highest
softmax probability, weighted by those probabilities (renormalized to sum to one when
``norm_topk_prob``). Shared experts, when the config has them, run on every token.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from metrale_config import ModelConfig, MoeConfig
from metrale_kernels import KernelBackend
from metrale_model_arch.counts.moe import SPARSE, require_moe
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, Skip, TensorTarget
from metrale_model_arch.families.llama import (
    UNSUPPORTED_FEATURES,
    LlamaForCausalLM,
    LlamaMLP,
    check_supported,
    llama_checkpoint_mapping,
)


class StackedExperts(nn.Module):
    """On the CPU the loader stores both weights input-major, as transposed views
    (:func:`~metrale_model_arch.build.column_major_names`)."""

    WEIGHTS = ("gate_up_proj", "down_proj")

    def __init__(self, hidden_size: int, moe: MoeConfig) -> None:
        super().__init__()
        num_experts, intermediate = moe.num_experts, moe.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate))


class SparseMoeBlock(nn.Module):
    def __init__(self, config: ModelConfig, moe: MoeConfig, backend: KernelBackend) -> None:
        super().__init__()
        self.top_k = moe.num_experts_per_tok
        self.renormalize = moe.norm_topk_prob
        self.routed_scaling_factor = moe.routed_scaling_factor
        self.backend = backend
        self.gate = nn.Linear(config.hidden_size, moe.num_experts, bias=False)
        self.experts = StackedExperts(config.hidden_size, moe)
        self.shared_experts: LlamaMLP | None = None
        if moe.num_shared_experts > 0:
            size = moe.shared_expert_intermediate_size or (
                moe.num_shared_experts * moe.moe_intermediate_size
            )
            self.shared_experts = LlamaMLP(config, backend, intermediate_size=size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # (tokens, experts) -> (tokens, top_k) float32 weights and int64 expert ids
        topk_weights, topk_ids = self.backend.softmax_topk_routing(
            self.gate(hidden), self.top_k, self.renormalize
        )
        out = self.backend.fused_moe(
            hidden, self.experts.gate_up_proj, self.experts.down_proj, topk_weights, topk_ids
        )
        if self.routed_scaling_factor != 1.0:
            out = out * self.routed_scaling_factor
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden)
        return out


class MoeForCausalLM(LlamaForCausalLM):
    """Llama attention and norms; each layer's MLP is a :class:`SparseMoeBlock` where
    ``config.moe.mlp_layer_types`` says ``"sparse"``, a dense SwiGLU MLP elsewhere."""

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        moe = require_moe(config)
        check_supported(config, tuple(f for f in UNSUPPORTED_FEATURES if f != "moe"))
        if config.mlp_bias:
            raise ValueError(f"{config.model_type}: MoE experts with mlp_bias are not supported")
        if moe.n_group != 1 or moe.topk_group != 1:
            raise ValueError(
                f"{config.model_type}: grouped expert routing (n_group {moe.n_group}, "
                f"topk_group {moe.topk_group}) is not supported"
            )

    @staticmethod
    def build_mlp(config: ModelConfig, layer_index: int, backend: KernelBackend) -> nn.Module:
        moe = require_moe(config)
        if moe.mlp_layer_types[layer_index] == SPARSE:
            return SparseMoeBlock(config, moe, backend)
        return LlamaMLP(config, backend)


_PER_EXPERT = re.compile(
    r"(?P<prefix>model\.layers\.\d+\.)(?P<block>mlp|block_sparse_moe)\.experts\.(?P<expert>\d+)\."
    r"(?P<proj>gate_proj|up_proj|down_proj|w1|w3|w2)\.weight"
)
# Stacked: transformers' in-memory layout (gate_up_proj, down_proj) or GGUF's per projection.
_STACKED = re.compile(
    r"(?P<prefix>model\.layers\.\d+\.)mlp\.experts\."
    r"(?P<proj>gate_up_proj|gate_proj|up_proj|down_proj)(?:\.weight)?"
)
_ROUTER = re.compile(r"(?P<prefix>model\.layers\.\d+\.)block_sparse_moe\.gate\.weight")
_PROJECTION = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def moe_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    """Checkpoint names of routed experts -> slices of the stacked expert tensors.

    Per-expert tensors (``mlp.experts.E.{gate,up,down}_proj.weight``, Mixtral's
    ``block_sparse_moe.experts.E.{w1,w3,w2}.weight``), stacked ones (transformers' in-memory
    ``mlp.experts.{gate_up_proj,down_proj}``, GGUF's ``mlp.experts.{gate,up,down}_proj.weight``
    of ``(experts, rows, cols)``) and Mixtral's ``block_sparse_moe.gate.weight``; every other
    name as the llama family maps it (:func:`llama_checkpoint_mapping`).
    """
    other = llama_checkpoint_mapping(config)
    intermediate = require_moe(config).moe_intermediate_size
    halves = {"gate_proj": slice(0, intermediate), "up_proj": slice(intermediate, None)}

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        if match := _PER_EXPERT.fullmatch(name):
            experts = f"{match['prefix']}mlp.experts."
            expert, proj = int(match["expert"]), _PROJECTION.get(match["proj"], match["proj"])
            if proj == "down_proj":
                return TensorTarget(experts + "down_proj", (expert,))
            return TensorTarget(experts + "gate_up_proj", (expert, halves[proj]))
        if match := _STACKED.fullmatch(name):
            experts = f"{match['prefix']}mlp.experts."
            proj = match["proj"]
            if proj in halves:
                return TensorTarget(experts + "gate_up_proj", (slice(None), halves[proj]))
            return TensorTarget(experts + proj)
        if match := _ROUTER.fullmatch(name):
            return TensorTarget(f"{match['prefix']}mlp.gate.weight")
        return other(name, shape)

    return target
