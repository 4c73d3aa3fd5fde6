"""DeepSeek-V2 / V3 (``deepseek_v2``, ``deepseek_v3``): MLA attention over a paged latent cache
(:mod:`.attention`), a dense SwiGLU MLP on the layers before ``first_k_dense_replace`` (and
off ``moe_layer_freq``), DeepSeek's MoE elsewhere: V2's softmax routing (:mod:`.moe`), V3's
sigmoid scores with a correction bias, group-limited
(:class:`~metrale_model_arch.families.glm5_next.mlp.GlmMoeBlock`).

A V3 checkpoint's multi-token-prediction layers (``model.layers.{num_hidden_layers + k}``) are
skipped at load (see :mod:`.mapping`). Eager only, a
:class:`~metrale_model_arch.families.decoder_stack.DecoderStack`: no layer here is a llama layer.
"""

from __future__ import annotations

import torch

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.counts.moe import SPARSE, require_moe
from metrale_model_arch.families.base import LayerCache
from metrale_model_arch.families.decoder_stack import (
    DecoderStack,
    EagerCausalLM,
    PreNormDecoderLayer,
)
from metrale_model_arch.families.deepseek.attention import MlaAttention
from metrale_model_arch.families.deepseek.moe import DeepseekV2MoeBlock
from metrale_model_arch.families.glm5_next.mlp import GlmMoeBlock
from metrale_model_arch.families.llama import (
    UNSUPPORTED_FEATURES,
    LlamaMLP,
    RMSNorm,
    check_supported,
)
from metrale_model_arch.families.rotary import rope_or_yarn_cos_sin_table

DEEPSEEK_V2 = "deepseek_v2"


class DeepseekDecoderLayer(PreNormDecoderLayer):
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

    def attention(
        self,
        normed: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        (latent_cache,) = kv_cache
        out: torch.Tensor = self.self_attn(normed, positions, cos_sin, latent_cache, metadata)
        return out


class DeepseekForCausalLM(EagerCausalLM):
    """Model types ``deepseek_v2`` and ``deepseek_v3`` (see :class:`CausalLM` and this
    module's docstring)."""

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        check_deepseek_config(config)

    def build_model(self) -> DecoderStack:
        config, backend = self.config, self.backend
        # cos_sin_cache: (max_seq_len, qk_rope_head_dim), YaRN's with DeepSeek's mscale.
        return DecoderStack(
            config,
            (
                DeepseekDecoderLayer(config, kind == SPARSE, backend)
                for kind in require_moe(config).mlp_layer_types
            ),
            RMSNorm(config.hidden_size, config.rms_norm_eps, backend),
            rope_or_yarn_cos_sin_table(config, self.max_seq_len),
        )


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
