"""gpt-oss (``gpt_oss``): GQA attention with q/k/v/o biases and a learned sink logit per head,
sliding-window (128 tokens) and full layers alternating as ``layer_types`` says, YaRN RoPE, and
in every layer the routed MoE of :mod:`.experts`. Norms multiply in float32 (transformers
keeps gpt-oss's norm weights float32).

Attention runs the row-invariant torch path (:func:`~metrale_kernels.reference.
row_invariant_attention.row_invariant_attention`): no kernel backend adds the sinks. Eager
only: no layer here is a llama layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend, TorchBackend
from metrale_kernels.reference.row_invariant_attention import row_invariant_attention
from metrale_model_arch.cache_spec import layer_sliding_window
from metrale_model_arch.counts.moe import require_moe
from metrale_model_arch.families.base import CausalLM, LayerCache, LayerState
from metrale_model_arch.families.deepseek.yarn import deepseek_cos_sin_table
from metrale_model_arch.families.dense_variants import OffsetRMSNorm
from metrale_model_arch.families.gpt_oss.experts import GptOssMoeBlock
from metrale_model_arch.families.llama import LlamaAttention
from metrale_model_arch.families.row_invariant_layers import head_logits

ROPE_TYPES = ("yarn",)


class SinkAttention(LlamaAttention):
    def __init__(self, config: ModelConfig, layer_index: int, backend: KernelBackend) -> None:
        super().__init__(config, layer_sliding_window(config, layer_index), backend)
        self.sinks = nn.Parameter(torch.empty(config.num_attention_heads))

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        k_cache, v_cache = kv_cache
        self.backend.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        return row_invariant_attention(
            q, k_cache, v_cache, metadata, self.scale, self.sliding_window, sinks=self.sinks
        )


def float32_norm(config: ModelConfig, backend: KernelBackend) -> OffsetRMSNorm:
    return OffsetRMSNorm(config.hidden_size, config.rms_norm_eps, backend, offset=0.0)


class GptOssDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int, backend: KernelBackend) -> None:
        super().__init__()
        self.self_attn = SinkAttention(config, layer_index, backend)
        self.mlp = GptOssMoeBlock(config, require_moe(config))
        self.input_layernorm = float32_norm(config, backend)
        self.post_attention_layernorm = float32_norm(config, backend)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        attention = self.self_attn
        q, k, v = attention.project_qkv(self.input_layernorm(hidden), positions, cos_sin)
        attended = attention.attend(q, k, v, kv_cache, metadata)
        hidden = hidden + attention.o_proj(attended.reshape(hidden.shape[0], -1))
        out: torch.Tensor = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return out


class GptOssModel(nn.Module):
    def __init__(self, config: ModelConfig, max_seq_len: int, backend: KernelBackend) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            GptOssDecoderLayer(config, i, backend) for i in range(config.num_hidden_layers)
        )
        self.norm = float32_norm(config, backend)
        # (max_seq_len, head_dim) float32: cos, then sin (YaRN-scaled); never in a checkpoint.
        self.cos_sin_cache: torch.Tensor
        self.register_buffer(
            "cos_sin_cache", deepseek_cos_sin_table(config, max_seq_len), persistent=False
        )


class GptOssForCausalLM(CausalLM):
    """Model type ``gpt_oss`` (see :class:`CausalLM` and this module's docstring)."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        max_seq_len: int | None = None,
        backend: KernelBackend | None = None,
    ) -> None:
        super().__init__()
        check_gpt_oss_config(config)
        self.config = config
        self.max_seq_len = max_seq_len or config.max_position_embeddings
        self.backend = backend if backend is not None else TorchBackend()
        self.model = GptOssModel(config, self.max_seq_len, self.backend)
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
        layers = cast("Sequence[GptOssDecoderLayer]", self.model.layers)
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


def check_gpt_oss_config(config: ModelConfig) -> None:
    """Raise ``ValueError`` naming what this family cannot run in ``config``."""
    moe = require_moe(config)
    if config.swiglu_alpha is None or config.swiglu_limit is None:
        raise ValueError(f"{config.source}: gpt_oss needs swiglu_alpha and swiglu_limit")
    scaling = config.rope_scaling
    if scaling is not None and scaling.rope_type not in ROPE_TYPES:
        raise ValueError(
            f"{config.source}: gpt_oss with rope_type {scaling.rope_type!r} is not supported "
            f"(supported: default, {', '.join(ROPE_TYPES)})"
        )
    if moe.num_shared_experts or set(moe.mlp_layer_types) != {"sparse"}:
        raise ValueError(f"{config.source}: gpt_oss layers are all routed experts, none shared")
    if config.num_attention_heads % config.num_key_value_heads:
        raise ValueError(
            f"num_attention_heads ({config.num_attention_heads}) is not a multiple of "
            f"num_key_value_heads ({config.num_key_value_heads})"
        )
