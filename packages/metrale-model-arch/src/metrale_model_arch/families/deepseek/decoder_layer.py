"""DeepSeek's decoder layer: MLA attention (:mod:`.attention`; V3.2's indexed
:mod:`.sparse_attention`), then a dense SwiGLU MLP or
DeepSeek's MoE (V2's softmax routing, :mod:`.moe`; V3's GLM-style sigmoid routing)."""

from __future__ import annotations

import torch

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.counts.moe import require_moe
from metrale_model_arch.families.base import LayerCache
from metrale_model_arch.families.decoder_stack import PreNormDecoderLayer
from metrale_model_arch.families.deepseek.attention import MlaAttention
from metrale_model_arch.families.deepseek.moe import DeepseekV2MoeBlock
from metrale_model_arch.families.deepseek.sparse_attention import SparseMlaAttention
from metrale_model_arch.families.glm5_next.mlp import GlmMoeBlock
from metrale_model_arch.families.llama import LlamaMLP, RMSNorm

DEEPSEEK_V2 = "deepseek_v2"
DEEPSEEK_V32 = "deepseek_v32"


class DeepseekDecoderLayer(PreNormDecoderLayer):
    def __init__(self, config: ModelConfig, is_sparse: bool, backend: KernelBackend) -> None:
        super().__init__()
        assert config.mla is not None
        self.self_attn: MlaAttention = (
            MlaAttention(config, config.mla, backend)
            if config.dsa is None
            else SparseMlaAttention(config, config.mla, config.dsa, backend)
        )
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
        if isinstance(self.self_attn, SparseMlaAttention):
            return self.self_attn.forward_sparse(normed, positions, cos_sin, kv_cache, metadata)
        (latent_cache,) = kv_cache
        out: torch.Tensor = self.self_attn(normed, positions, cos_sin, latent_cache, metadata)
        return out
