"""gpt-oss (``gpt_oss``): GQA attention with q/k/v/o biases and a learned sink logit per head,
sliding-window (128 tokens) and full layers alternating as ``layer_types`` says, YaRN RoPE, and
in every layer the routed MoE of :mod:`.experts`. Norms multiply in float32 (transformers
keeps gpt-oss's norm weights float32).

Attention is the backend's ``paged_attention`` with the sinks (the cpu backend's native kernel
for float32, else the row-invariant torch path). Eager only, a
:class:`~metrale_model_arch.families.decoder_stack.DecoderStack`: no layer here is a llama layer.
"""

from __future__ import annotations

import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.cache_spec import layer_sliding_window
from metrale_model_arch.counts.moe import require_moe
from metrale_model_arch.families.base import LayerCache
from metrale_model_arch.families.decoder_stack import (
    DecoderStack,
    EagerCausalLM,
    PreNormDecoderLayer,
)
from metrale_model_arch.families.dense_variants import OffsetRMSNorm
from metrale_model_arch.families.gpt_oss.experts import GptOssMoeBlock
from metrale_model_arch.families.llama import LlamaAttention
from metrale_model_arch.families.rotary import YARN, rope_or_yarn_cos_sin_table

ROPE_TYPES = (YARN,)


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
        metadata = metadata.for_window(self.sliding_window)
        self.backend.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        return self.backend.paged_attention(
            q, k_cache, v_cache, metadata, self.scale, self.sliding_window, sinks=self.sinks
        )


def float32_norm(config: ModelConfig, backend: KernelBackend) -> OffsetRMSNorm:
    return OffsetRMSNorm(config.hidden_size, config.rms_norm_eps, backend, offset=0.0)


class GptOssDecoderLayer(PreNormDecoderLayer):
    def __init__(self, config: ModelConfig, layer_index: int, backend: KernelBackend) -> None:
        super().__init__()
        self.self_attn = SinkAttention(config, layer_index, backend)
        self.mlp = GptOssMoeBlock(config, require_moe(config), backend)
        self.input_layernorm = float32_norm(config, backend)
        self.post_attention_layernorm = float32_norm(config, backend)


class GptOssForCausalLM(EagerCausalLM):
    """Model type ``gpt_oss`` (see :class:`CausalLM` and this module's docstring)."""

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        check_gpt_oss_config(config)

    def build_model(self) -> DecoderStack:
        config, backend = self.config, self.backend
        # cos_sin_cache: (max_seq_len, head_dim), YaRN-scaled.
        return DecoderStack(
            config,
            (GptOssDecoderLayer(config, i, backend) for i in range(config.num_hidden_layers)),
            float32_norm(config, backend),
            rope_or_yarn_cos_sin_table(config, self.max_seq_len),
        )


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
