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
from metrale_model_arch.families.glm5_next.decoder_layer import Glm5NextDecoderLayer
from metrale_model_arch.families.glm5_next.dsa_attention import Selections
from metrale_model_arch.families.glm5_next.mtp import Glm5NextMtpLayer
from metrale_model_arch.families.glm5_next.vision.tower import Glm5NextVisionModel
from metrale_model_arch.families.llama import RMSNorm
from metrale_model_arch.families.row_invariant_layers import head_logits
from metrale_model_arch.glm5_next_skeleton import Glm5NextTextSkeleton

SUPPORTED_HIDDEN_ACTS = ("silu",)


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
        num_mtp = config.mtp.num_layers if config.mtp is not None else 0
        self.mtp_layers = nn.ModuleList(
            Glm5NextMtpLayer(config, k, backend) for k in range(num_mtp)
        )


class Glm5NextForCausalLM(CausalLM):
    """Model types ``glm5_next`` and ``glm5_next_text`` (see :class:`CausalLM`); a checkpoint's
    vision tower is ``model.visual`` (run by :mod:`.vision.placement`, which gives ``forward``
    its ``inputs_embeds``), its MTP layers ``model.mtp_layers`` (:mod:`.mtp`)."""

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

    @property
    def num_mtp_layers(self) -> int:
        return len(self.model.mtp_layers)

    def forward_mtp(
        self,
        input_ids: torch.Tensor,
        previous_hidden: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
        state: LayerState = (),
    ) -> torch.Tensor:
        embeds = self.model.embed_tokens(input_ids)
        return self._mtp_layer.forward_mtp(
            embeds, previous_hidden, positions, kv_cache, state, metadata
        )

    def compute_mtp_logits(
        self, hidden: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return head_logits(self.lm_head, self._mtp_layer.shared_head.norm(hidden), out)

    @property
    def _mtp_layer(self) -> Glm5NextMtpLayer:
        return cast("Glm5NextMtpLayer", self.model.mtp_layers[0])


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
