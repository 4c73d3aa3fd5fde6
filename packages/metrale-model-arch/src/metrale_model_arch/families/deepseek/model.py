"""DeepSeek-V2 / V3 (``deepseek_v2``, ``deepseek_v3``): MLA attention over a paged latent cache
(:mod:`.attention`), a dense SwiGLU MLP on the layers before ``first_k_dense_replace`` (and
off ``moe_layer_freq``), DeepSeek's MoE elsewhere: V2's softmax routing (:mod:`.moe`), V3's
sigmoid scores with a correction bias, group-limited
(:class:`~metrale_model_arch.families.glm5_next.mlp.GlmMoeBlock`).

A V3 checkpoint's multi-token-prediction layers (``model.layers.{num_hidden_layers + k}``) are
skipped at load (see :mod:`.mapping`). Eager only: no layer here is a llama layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend, TorchBackend
from metrale_model_arch.counts.moe import SPARSE, require_moe
from metrale_model_arch.families.base import CausalLM, LayerCache, LayerState
from metrale_model_arch.families.deepseek.attention import MlaAttention
from metrale_model_arch.families.deepseek.moe import DeepseekV2MoeBlock
from metrale_model_arch.families.deepseek.yarn import deepseek_cos_sin_table
from metrale_model_arch.families.glm5_next.mlp import GlmMoeBlock
from metrale_model_arch.families.llama import (
    UNSUPPORTED_FEATURES,
    LlamaMLP,
    RMSNorm,
    check_supported,
)
from metrale_model_arch.families.row_invariant_layers import head_logits

DEEPSEEK_V2 = "deepseek_v2"


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, is_sparse: bool, backend: KernelBackend) -> None:
        super().__init__()
        assert config.mla is not None
        self.self_attn = MlaAttention(config, config.mla, backend)
        self.mlp: DeepseekV2MoeBlock | GlmMoeBlock | LlamaMLP
        if not is_sparse:
            self.mlp = LlamaMLP(config, backend)
        elif config.model_type == DEEPSEEK_V2:
            self.mlp = DeepseekV2MoeBlock(config, require_moe(config), backend)
        else:
            self.mlp = GlmMoeBlock(config, require_moe(config), backend)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        (latent_cache,) = kv_cache
        attended = self.self_attn(
            self.input_layernorm(hidden), positions, cos_sin, latent_cache, metadata
        )
        hidden = hidden + attended
        out: torch.Tensor = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return out


class DeepseekModel(nn.Module):
    def __init__(self, config: ModelConfig, max_seq_len: int, backend: KernelBackend) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DeepseekDecoderLayer(config, kind == SPARSE, backend)
            for kind in require_moe(config).mlp_layer_types
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)
        # (max_seq_len, qk_rope_head_dim) float32: cos, then sin; never in a checkpoint.
        self.cos_sin_cache: torch.Tensor
        self.register_buffer(
            "cos_sin_cache", deepseek_cos_sin_table(config, max_seq_len), persistent=False
        )


class DeepseekForCausalLM(CausalLM):
    """Model types ``deepseek_v2`` and ``deepseek_v3`` (see :class:`CausalLM` and this
    module's docstring)."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        max_seq_len: int | None = None,
        backend: KernelBackend | None = None,
    ) -> None:
        super().__init__()
        check_deepseek_config(config)
        self.config = config
        self.max_seq_len = max_seq_len or config.max_position_embeddings
        self.backend = backend if backend is not None else TorchBackend()
        self.model = DeepseekModel(config, self.max_seq_len, self.backend)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[LayerCache],
        metadata: AttentionMetadata,
        states: Sequence[LayerState] = (),
    ) -> torch.Tensor:
        del states  # no per-sequence state
        layers = cast("Sequence[DeepseekDecoderLayer]", self.model.layers)
        if len(kv_caches) != len(layers):
            raise ValueError(f"{len(kv_caches)} KV caches for {len(layers)} layers")
        cos_sin = self.model.cos_sin_cache
        hidden = self.model.embed_tokens(input_ids)
        for layer, kv_cache in zip(layers, kv_caches, strict=True):
            hidden = layer(hidden, positions, cos_sin, kv_cache, metadata)
        out: torch.Tensor = self.model.norm(hidden)
        return out

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return head_logits(self.lm_head, hidden, out)


def check_deepseek_config(config: ModelConfig) -> None:
    """Raise ``ValueError`` naming what this family cannot run in ``config``."""
    moe = require_moe(config)
    if config.mla is None:
        raise ValueError(f"{config.source}: a {config.model_type} config needs its MLA fields")
    check_supported(config, tuple(f for f in UNSUPPORTED_FEATURES if f not in ("moe", "mla")))
    if config.mlp_bias:
        raise ValueError(f"{config.source}: {config.model_type} with mlp_bias is not supported")
    if config.model_type == DEEPSEEK_V2 and moe.norm_topk_prob:
        # transformers' DeepseekV2 ignores it; no published V2 config sets it.
        raise ValueError(f"{config.source}: deepseek_v2 with norm_topk_prob is not supported")
