"""Qwen3-Next (``qwen3_next``) over a paged cache and linear-state slots.

Layers are Gated DeltaNet linear attention (:mod:`.gated_deltanet`) or gated full attention
where ``layer_types`` says: q/k RMSNorms per head, RoPE over the leading
``partial_rotary_factor`` of each head, the output times ``sigmoid`` of a gate that the q
projection computes beside each query head. Every layer's FFN is the routed MoE plus one shared
expert scaled by its own sigmoid gate (a dense SwiGLU MLP on ``mlp_only_layers``). Every
RMSNorm but the linear layers' gated one scales by ``1 + weight``.

It runs eagerly over a :class:`~metrale_model_arch.families.decoder_stack.DecoderStack`, never
through the compiled or native llama executors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import attrs
import torch
from torch import nn

from metrale_config import LINEAR_ATTENTION, ModelConfig, MoeConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.counts.moe import SPARSE, require_moe
from metrale_model_arch.families.base import LayerCache, LayerState
from metrale_model_arch.families.decoder_stack import DecoderStack, EagerCausalLM
from metrale_model_arch.families.dense_variants import OffsetRMSNorm, VariantAttention
from metrale_model_arch.families.llama import LlamaMLP, qkv_sizes
from metrale_model_arch.families.moe import SparseMoeBlock
from metrale_model_arch.families.qwen3_next.gated_deltanet import GatedDeltaNet
from metrale_model_arch.families.rotary import rope_cos_sin_table

SUPPORTED_HIDDEN_ACTS = ("silu",)


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
    def __init__(self, config: ModelConfig, layer_index: int, backend: KernelBackend) -> None:
        super().__init__()
        self.is_linear = config.layer_types[layer_index] == LINEAR_ATTENTION
        self.linear_attn: GatedDeltaNet | None = None
        self.self_attn: GatedAttention | None = None
        if self.is_linear:
            assert config.linear_attention is not None
            self.linear_attn = GatedDeltaNet(
                config.hidden_size, config.linear_attention, config.rms_norm_eps, backend
            )
        else:
            self.self_attn = GatedAttention(config, layer_index, backend)
        moe = require_moe(config)
        self.mlp: SharedExpertMoeBlock | LlamaMLP
        if moe.mlp_layer_types[layer_index] == SPARSE:
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


class Qwen3NextForCausalLM(EagerCausalLM):
    """Model type ``qwen3_next`` (see :class:`CausalLM` and this module's docstring)."""

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        check_qwen3_next_config(config)

    def build_model(self) -> DecoderStack:
        config, backend = self.config, self.backend
        # cos_sin_cache: (max_seq_len, rotary_dim), plain RoPE over the rotated part.
        return DecoderStack(
            config,
            (Qwen3NextDecoderLayer(config, i, backend) for i in range(config.num_hidden_layers)),
            centred_norm(config, config.hidden_size, backend),
            rope_cos_sin_table(config, self.max_seq_len),
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[LayerCache],
        metadata: AttentionMetadata,
        states: Sequence[LayerState] = (),
    ) -> torch.Tensor:
        layers = cast("Sequence[Qwen3NextDecoderLayer]", self.model.layers)
        if len(kv_caches) != len(layers) or len(states) != len(layers):
            raise ValueError(
                f"{len(kv_caches)} KV caches and {len(states)} states for {len(layers)} layers"
            )
        cos_sin = self.model.cos_sin_cache
        hidden = self.embed(input_ids)
        for layer, kv_cache, state in zip(layers, kv_caches, states, strict=True):
            hidden = layer(hidden, positions, cos_sin, kv_cache, state, metadata)
        out: torch.Tensor = self.model.norm(hidden)
        return out


def check_qwen3_next_config(config: ModelConfig) -> None:
    """Raise ``ValueError`` naming what this family cannot run in ``config``."""
    if config.hidden_act not in SUPPORTED_HIDDEN_ACTS:
        raise ValueError(
            f"unsupported hidden_act {config.hidden_act!r} for {config.model_type}; "
            f"supported: {', '.join(SUPPORTED_HIDDEN_ACTS)}"
        )
    require_moe(config)
    linear = config.linear_attention
    if linear is None:
        raise ValueError(f"{config.source}: a qwen3_next config needs its linear attention fields")
    if linear.num_heads % linear.num_key_heads:
        raise ValueError(
            f"{config.source}: {linear.num_heads} linear value heads do not divide into "
            f"{linear.num_key_heads} key heads"
        )
    if config.rope_scaling is not None:
        raise ValueError(
            f"{config.source}: qwen3_next with rope_type {config.rope_scaling.rope_type!r} is "
            "not supported (plain RoPE only)"
        )
    if config.mlp_bias or config.sliding_window is not None:
        raise ValueError(f"{config.source}: qwen3_next with MLP biases or a sliding window")
