"""Qwen3-Next's decoder layer: a Gated DeltaNet (:mod:`.gated_deltanet`) or gated
full-attention mixer, then the routed MoE with its gated shared expert (or a dense SwiGLU MLP),
each after a ``(1 + w)`` RMSNorm; the stack's layers and the MTP layers' blocks alike."""

from __future__ import annotations

import attrs
import torch
from torch import nn

from metrale_config import LINEAR_ATTENTION, ModelConfig, MoeConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.counts.moe import SPARSE, require_moe
from metrale_model_arch.families.base import LayerCache, LayerState
from metrale_model_arch.families.dense_variants import OffsetRMSNorm, VariantAttention
from metrale_model_arch.families.llama import LlamaMLP, qkv_sizes
from metrale_model_arch.families.moe import SparseMoeBlock
from metrale_model_arch.families.qwen3_next.gated_deltanet import GatedDeltaNet


def centred_norm(config: ModelConfig, size: int, backend: KernelBackend) -> OffsetRMSNorm:
    return OffsetRMSNorm(size, config.rms_norm_eps, backend, offset=1.0)


class GatedAttention(VariantAttention):
    """GQA whose q projection holds, per head, the query rows then its output gate's rows."""

    def __init__(self, config: ModelConfig, layer_index: int, backend: KernelBackend) -> None:
        super().__init__(config, layer_index, backend)
        q_size, kv_size = qkv_sizes(config)
        self.qkv_split = (2 * q_size, kv_size, kv_size)
        self.qkv_proj = nn.Linear(
            config.hidden_size, 2 * q_size + 2 * kv_size, bias=config.qkv_bias
        )
        self.q_norm = centred_norm(config, self.head_dim, backend)
        self.k_norm = centred_norm(config, self.head_dim, backend)

    def forward(
        self,
        normed: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        tokens = normed.shape[0]
        gated_q, k, v = self.qkv_proj(normed).split(self.qkv_split, dim=-1)
        # (tokens, heads, 2, head_dim): the query, then its gate.
        q, gate = gated_q.view(tokens, self.num_heads, 2, self.head_dim).unbind(2)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        assert self.q_norm is not None
        assert self.k_norm is not None
        q, k = self.rotate(self.q_norm(q.contiguous()), self.k_norm(k), positions, cos_sin)
        attended = self.attend(q, k, v, kv_cache, metadata)
        out: torch.Tensor = self.o_proj((attended * torch.sigmoid(gate)).reshape(tokens, -1))
        return out


class SharedExpertMoeBlock(SparseMoeBlock):
    """The routed experts plus ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``."""

    def __init__(self, config: ModelConfig, moe: MoeConfig, backend: KernelBackend) -> None:
        super().__init__(config, attrs.evolve(moe, num_shared_experts=0), backend)
        size = moe.shared_expert_intermediate_size or moe.moe_intermediate_size
        self.shared_expert = LlamaMLP(config, backend, intermediate_size=size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(self.shared_expert_gate(hidden)) * self.shared_expert(hidden)
        out: torch.Tensor = super().forward(hidden) + shared
        return out


class Qwen3NextDecoderLayer(nn.Module):
    """Stack layer ``layer_index`` (its mixer and FFN as ``layer_types`` and the MoE's
    ``mlp_layer_types`` say), or, given ``is_linear`` and ``is_sparse``, a layer the stack does
    not hold (an MTP layer's block)."""

    def __init__(
        self,
        config: ModelConfig,
        layer_index: int,
        backend: KernelBackend,
        *,
        is_linear: bool | None = None,
        is_sparse: bool | None = None,
    ) -> None:
        super().__init__()
        moe = require_moe(config)
        if is_linear is None:
            is_linear = config.layer_types[layer_index] == LINEAR_ATTENTION
        if is_sparse is None:
            is_sparse = moe.mlp_layer_types[layer_index] == SPARSE
        self.is_linear = is_linear
        self.linear_attn: GatedDeltaNet | None = None
        self.self_attn: GatedAttention | None = None
        if self.is_linear:
            assert config.linear_attention is not None
            self.linear_attn = GatedDeltaNet(
                config.hidden_size, config.linear_attention, config.rms_norm_eps, backend
            )
        else:
            self.self_attn = GatedAttention(config, layer_index, backend)
        self.mlp: SharedExpertMoeBlock | LlamaMLP
        if is_sparse:
            self.mlp = SharedExpertMoeBlock(config, moe, backend)
        else:
            self.mlp = LlamaMLP(config, backend)
        self.input_layernorm = centred_norm(config, config.hidden_size, backend)
        self.post_attention_layernorm = centred_norm(config, config.hidden_size, backend)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: LayerCache,
        state: LayerState,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        normed = self.input_layernorm(hidden)
        if self.linear_attn is not None:
            mixed = self.linear_attn(normed, state, metadata)
        else:
            assert self.self_attn is not None
            mixed = self.self_attn(normed, positions, cos_sin, kv_cache, metadata)
        hidden = hidden + mixed
        out: torch.Tensor = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return out
