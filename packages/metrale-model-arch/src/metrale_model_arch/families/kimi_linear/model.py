"""Kimi Linear (``kimi_linear``) over a paged latent cache and linear-state slots.

Each layer mixes tokens with KDA linear attention (GLM-5.3's,
:mod:`~metrale_model_arch.families.glm5_next.kda_attention`, its forget gate unbounded) or with
MLA (DeepSeek's, :mod:`~metrale_model_arch.families.deepseek.attention`) that rotates nothing:
no layer has a position encoding. Its FFN is a dense SwiGLU MLP or DeepSeek-V3's MoE (sigmoid
routing with a correction bias, shared experts,
:class:`~metrale_model_arch.families.glm5_next.mlp.GlmMoeBlock` unclamped), pre-norm residuals
around both. Eager only, a :class:`~metrale_model_arch.families.decoder_stack.DecoderStack`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from metrale_config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.counts.moe import SPARSE, require_moe
from metrale_model_arch.families.base import LayerCache, LayerState
from metrale_model_arch.families.decoder_stack import DecoderStack, EagerCausalLM
from metrale_model_arch.families.deepseek.attention import MlaAttention
from metrale_model_arch.families.glm5_next.kda_attention import KdaAttention
from metrale_model_arch.families.glm5_next.mlp import ClampedSwiGluMlp, GlmMoeBlock
from metrale_model_arch.families.llama import RMSNorm
from metrale_model_arch.families.rotary import rope_cos_sin_table


class KimiLinearDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int, backend: KernelBackend) -> None:
        super().__init__()
        assert config.mla is not None
        assert config.linear_attention is not None
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn: KdaAttention | MlaAttention
        if config.layer_types[index] == LINEAR_ATTENTION:
            heads = config.linear_attention.num_heads
            self.self_attn = KdaAttention(
                hidden, config.linear_attention, eps, backend, a_log_shape=(1, 1, heads, 1)
            )
        else:
            self.self_attn = MlaAttention(config, config.mla, backend)
        moe = require_moe(config)
        self.mlp: GlmMoeBlock | ClampedSwiGluMlp
        if moe.mlp_layer_types[index] == SPARSE:
            self.mlp = GlmMoeBlock(config, moe, backend)
        else:
            self.mlp = ClampedSwiGluMlp(hidden, config.intermediate_size, None)
        self.input_layernorm = RMSNorm(hidden, eps, backend)
        self.post_attention_layernorm = RMSNorm(hidden, eps, backend)

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
        if isinstance(self.self_attn, KdaAttention):
            mixed = self.self_attn(normed, state, metadata)
        else:
            (latent_cache,) = kv_cache
            mixed = self.self_attn(normed, positions, cos_sin, latent_cache, metadata)
        hidden = hidden + mixed
        out: torch.Tensor = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return out


class KimiLinearForCausalLM(EagerCausalLM):
    """Model type ``kimi_linear`` (see :class:`CausalLM` and this module's docstring)."""

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        check_kimi_linear_config(config)

    def build_model(self) -> DecoderStack:
        config = self.config
        return DecoderStack(
            config,
            (
                KimiLinearDecoderLayer(config, index, self.backend)
                for index in range(config.num_hidden_layers)
            ),
            RMSNorm(config.hidden_size, config.rms_norm_eps, self.backend),
            # (max_seq_len, 0): MLA here rotates nothing.
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
        layers = self.model.layers
        if len(kv_caches) != len(layers):
            raise ValueError(f"{len(kv_caches)} KV caches for {len(layers)} layers")
        layer_states = states or ((),) * len(layers)
        if len(layer_states) != len(layers):
            raise ValueError(f"{len(layer_states)} layer states for {len(layers)} layers")
        cos_sin = self.model.cos_sin_cache
        hidden = self.embed(input_ids)
        for layer, kv_cache, state in zip(layers, kv_caches, layer_states, strict=True):
            hidden = layer(hidden, positions, cos_sin, kv_cache, state, metadata)
        out: torch.Tensor = self.model.norm(hidden)
        return out


def check_kimi_linear_config(config: ModelConfig) -> None:
    """Raise ``ValueError`` naming what this family cannot run in ``config``."""
    moe = require_moe(config)
    for name in ("mla", "linear_attention"):
        if getattr(config, name) is None:
            raise ValueError(f"{config.source}: a kimi_linear config needs its {name} fields")
    assert config.mla is not None
    if config.mla.is_rotary or config.rope_scaling is not None:
        raise ValueError(f"{config.source}: kimi_linear's MLA rotates nothing (no RoPE)")
    if config.hidden_act != "silu" or config.mlp_bias or config.swiglu_limit is not None:
        raise ValueError(f"{config.source}: kimi_linear's MLPs are plain SiLU SwiGLU, bias-free")
    kinds = set(config.layer_types)
    if len(config.layer_types) != config.num_hidden_layers or kinds - {
        FULL_ATTENTION,
        LINEAR_ATTENTION,
    }:
        raise ValueError(
            f"{config.source}: kimi_linear needs one full_attention or linear_attention "
            "layer type a layer"
        )
    if len(moe.mlp_layer_types) != config.num_hidden_layers:
        raise ValueError(f"{config.source}: kimi_linear needs one MLP kind a layer")
