"""One GLM-5.3 decoder layer: hyper-connections around its mixer (DSA or KDA) and its FFN."""

from __future__ import annotations

import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.families.base import LayerCache, LayerState
from metrale_model_arch.families.glm5_next.dsa_attention import DsaAttention, Selections
from metrale_model_arch.families.glm5_next.hyper_connections import HyperConnection
from metrale_model_arch.families.glm5_next.kda_attention import KdaAttention
from metrale_model_arch.families.glm5_next.mlp import ClampedSwiGluMlp, GlmMoeBlock
from metrale_model_arch.families.llama import RMSNorm
from metrale_model_arch.glm5_next_skeleton import Ffn, Mixer, SkeletonLayer


class Glm5NextDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: SkeletonLayer, backend: KernelBackend) -> None:
        super().__init__()
        assert config.mhc is not None
        assert config.mla is not None
        assert config.dsa is not None
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.attn_hc = HyperConnection(hidden, config.mhc, eps)
        self.ffn_hc = HyperConnection(hidden, config.mhc, eps)
        self.input_layernorm = RMSNorm(hidden, eps, backend)
        self.post_attention_layernorm = RMSNorm(hidden, eps, backend)
        self.self_attn: DsaAttention | KdaAttention
        if layer.mixer is Mixer.DSA:
            self.self_attn = DsaAttention(
                hidden,
                config.num_attention_heads,
                config.mla,
                config.dsa,
                layer.has_own_indexer,
                eps,
                backend,
            )
        else:
            assert config.linear_attention is not None
            self.self_attn = KdaAttention(hidden, config.linear_attention, eps, backend)
        self.mlp: GlmMoeBlock | ClampedSwiGluMlp
        if layer.ffn is Ffn.MOE:
            assert config.moe is not None
            self.mlp = GlmMoeBlock(config, config.moe, backend)
        else:
            self.mlp = ClampedSwiGluMlp(hidden, config.intermediate_size, config.swiglu_limit)

    def forward(
        self,
        streams: torch.Tensor,
        positions: torch.Tensor,
        cache: LayerCache,
        state: LayerState,
        metadata: AttentionMetadata,
        shared: Selections | None,
    ) -> tuple[torch.Tensor, Selections | None]:
        """``streams (tokens, N, hidden)`` -> new streams, and the DSA selections a shared
        layer right after this one reuses (``None`` after a KDA layer)."""
        layer_input, post, comb = self.attn_hc.read(streams)
        x = self.input_layernorm(layer_input)
        selections: Selections | None = None
        if isinstance(self.self_attn, DsaAttention):
            mixed, selections = self.self_attn(x, positions, cache, state, metadata, shared)
        else:
            mixed = self.self_attn(x, state, metadata)
        streams = HyperConnection.write(streams, mixed, post, comb)
        layer_input, post, comb = self.ffn_hc.read(streams)
        out = self.mlp(self.post_attention_layernorm(layer_input))
        return HyperConnection.write(streams, out, post, comb), selections
