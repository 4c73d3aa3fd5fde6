"""GLM-5.3's text model (``glm5_next``, ``glm5_next_text``) over a paged cache and state slots.

Each token's residual is ``hc_mult`` streams (:mod:`.hyper_connections`). A layer reads the
streams into its mixer (KDA linear attention, :mod:`.kda_attention`, or a DSA layer,
:mod:`.dsa_attention`) and writes them back, then the same around its FFN (a clamped SwiGLU MLP
or the MoE, :mod:`.mlp`). The final hidden state is the final norm of the streams' mean; the
LM head is separate from the embeddings. There is no position encoding: positions only align
the indexer's pools.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend, TorchBackend
from metrale_model_arch.families.base import CausalLM, LayerCache, LayerState
from metrale_model_arch.families.glm5_next.dsa_attention import DsaAttention, Selections
from metrale_model_arch.families.glm5_next.hyper_connections import HyperConnection
from metrale_model_arch.families.glm5_next.kda_attention import KdaAttention
from metrale_model_arch.families.glm5_next.mlp import ClampedSwiGluMlp, GlmMoeBlock
from metrale_model_arch.families.glm5_next.vision.tower import Glm5NextVisionModel
from metrale_model_arch.families.llama import RMSNorm
from metrale_model_arch.families.row_invariant_layers import head_logits
from metrale_model_arch.glm5_next_skeleton import (
    Ffn,
    Glm5NextTextSkeleton,
    Mixer,
    SkeletonLayer,
)

SUPPORTED_HIDDEN_ACTS = ("silu",)


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


class Glm5NextModel(nn.Module):
    def __init__(self, config: ModelConfig, backend: KernelBackend) -> None:
        super().__init__()
        skeleton = Glm5NextTextSkeleton.from_config(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            Glm5NextDecoderLayer(config, layer, backend) for layer in skeleton.layers
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)
        self.visual = (
            Glm5NextVisionModel(config.vision, backend) if config.vision is not None else None
        )


class Glm5NextForCausalLM(CausalLM):
    """Model types ``glm5_next`` and ``glm5_next_text`` (see :class:`CausalLM`); a checkpoint's
    vision tower is ``model.visual`` (run by :mod:`.vision.placement`, which gives ``forward``
    its ``inputs_embeds``), its MTP layer is not part of it."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        max_seq_len: int | None = None,
        backend: KernelBackend | None = None,
    ) -> None:
        super().__init__()
        check_glm5_next_config(config)
        assert config.mhc is not None
        self.config = config
        self.max_seq_len = max_seq_len or config.max_position_embeddings
        self.backend = backend if backend is not None else TorchBackend()
        self.num_streams = config.mhc.num_streams
        self.model = Glm5NextModel(config, self.backend)
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
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``inputs_embeds (tokens, hidden)``, when given, stand for ``input_ids``' embeddings."""
        layers = cast("Sequence[Glm5NextDecoderLayer]", self.model.layers)
        if len(kv_caches) != len(layers):
            raise ValueError(f"{len(kv_caches)} KV caches for {len(layers)} layers")
        layer_states = states or ((),) * len(layers)
        if len(layer_states) != len(layers):
            raise ValueError(f"{len(layer_states)} layer states for {len(layers)} layers")
        hidden = self.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        streams = hidden.unsqueeze(1).expand(-1, self.num_streams, -1).contiguous()
        selections: Selections | None = None
        for layer, cache, state in zip(layers, kv_caches, layer_states, strict=True):
            streams, selections = layer(streams, positions, cache, state, metadata, selections)
        out: torch.Tensor = self.model.norm(streams.mean(dim=1))
        return out

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return head_logits(self.lm_head, hidden, out)


def check_glm5_next_config(config: ModelConfig) -> None:
    """Raise ``ValueError`` naming what this family cannot run in ``config``."""
    if config.hidden_act not in SUPPORTED_HIDDEN_ACTS:
        raise ValueError(
            f"unsupported hidden_act {config.hidden_act!r} for {config.model_type}; "
            f"supported: {', '.join(SUPPORTED_HIDDEN_ACTS)}"
        )
    for name in ("mhc", "mla", "dsa", "moe", "linear_attention"):
        if getattr(config, name) is None:
            raise ValueError(f"{config.source}: a glm5_next config needs its {name} fields")
    if config.qkv_bias or config.o_proj_bias:
        raise ValueError(f"{config.source}: glm5_next with attention_bias is not supported")
    if config.vision is not None and config.vision.out_hidden_size != config.hidden_size:
        raise ValueError(
            f"{config.source}: vision_config.out_hidden_size ({config.vision.out_hidden_size}) "
            f"must equal the text hidden_size ({config.hidden_size})"
        )
    assert config.dsa is not None
    previous_full = False
    for index, kind in enumerate(config.dsa.indexer_types):
        is_dsa = config.layer_types[index] == "sparse_attention"
        if is_dsa and kind == "shared" and not previous_full:
            raise ValueError(
                f"{config.source}: DSA layer {index} shares an indexer, but the layer before "
                "it is not a DSA layer with its own (a shared layer must directly follow one)"
            )
        previous_full = is_dsa and kind == "full"
