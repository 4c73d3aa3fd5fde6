"""GLM-4.5 / 4.6 (``glm4_moe``): GQA attention with partial rotary, q/k/v biases and optional
per-head q/k norms; the first ``first_k_dense_replace`` layers a dense SwiGLU MLP, the rest
GLM's MoE (sigmoid scores with a float32 correction bias, group-limited top-k, shared experts:
:class:`~metrale_model_arch.families.glm5_next.mlp.GlmMoeBlock`, unclamped).

The checkpoint's multi-token-prediction layers (``model.layers.{num_hidden_layers + k}``:
``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm`` and one decoder block) are loaded into
``model.mtp_layers`` and owned by ``weights.mtp`` in the memory plan. MTP speculation runs the
first (``forward_mtp``): h' = Block(eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)])), logits =
lm_head(shared_head.norm(h')), with the target's embedding and LM head (a copy of either inside
an MTP layer is skipped).

Its layers are no llama layer (partial rotary, the MoE block): it runs eagerly, a
:class:`~metrale_model_arch.families.decoder_stack.DecoderStack`, never through the compiled or
native llama executors.
"""

from __future__ import annotations

import re

import attrs
import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.counts.moe import SPARSE, require_moe
from metrale_model_arch.families.base import LayerCache
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, Skip, TensorTarget
from metrale_model_arch.families.decoder_stack import (
    DecoderStack,
    PreNormDecoderLayer,
)
from metrale_model_arch.families.dense_variants import VariantAttention
from metrale_model_arch.families.glm5_next.mlp import GlmMoeBlock
from metrale_model_arch.families.llama import (
    UNSUPPORTED_FEATURES,
    LlamaMLP,
    RMSNorm,
    check_supported,
)
from metrale_model_arch.families.moe import moe_checkpoint_mapping
from metrale_model_arch.families.mtp_causal_lm import MtpCausalLM, log_mtp_layers
from metrale_model_arch.families.rotary import rope_cos_sin_table

MTP_LAYERS = "model.mtp_layers"


class Glm4MoeDecoderLayer(PreNormDecoderLayer):
    def __init__(
        self, config: ModelConfig, layer_index: int, is_sparse: bool, backend: KernelBackend
    ) -> None:
        super().__init__()
        self.self_attn = VariantAttention(config, layer_index, backend)
        self.mlp: GlmMoeBlock | LlamaMLP
        if is_sparse:
            self.mlp = GlmMoeBlock(config, require_moe(config), backend)
        else:
            self.mlp = LlamaMLP(config, backend)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)


class SharedHead(nn.Module):
    def __init__(self, config: ModelConfig, backend: KernelBackend) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)


class Glm4MoeMtpLayer(Glm4MoeDecoderLayer):
    """One MTP layer's weights: its decoder block (this class's own attention, norms and MLP),
    ``enorm`` / ``hnorm`` over the next token's embedding and the target's hidden state,
    ``eh_proj (hidden, 2 * hidden)`` over their concatenation, and ``shared_head.norm`` before
    the target's LM head."""

    def __init__(
        self, config: ModelConfig, layer_index: int, is_sparse: bool, backend: KernelBackend
    ) -> None:
        super().__init__(config, layer_index, is_sparse, backend)
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = RMSNorm(hidden, eps, backend)
        self.hnorm = RMSNorm(hidden, eps, backend)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.shared_head = SharedHead(config, backend)

    def forward_mtp(
        self,
        embeds: torch.Tensor,
        previous_hidden: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        joined = torch.cat((self.enorm(embeds), self.hnorm(previous_hidden)), dim=-1)
        out: torch.Tensor = self(self.eh_proj(joined), positions, cos_sin, kv_cache, metadata)
        return out


class Glm4MoeModel(DecoderStack):
    def __init__(self, config: ModelConfig, max_seq_len: int, backend: KernelBackend) -> None:
        moe = require_moe(config)
        # cos_sin_cache: (max_seq_len, rotary_dim), plain RoPE over the rotated part.
        super().__init__(
            config,
            (
                Glm4MoeDecoderLayer(config, i, kind == SPARSE, backend)
                for i, kind in enumerate(moe.mlp_layer_types)
            ),
            RMSNorm(config.hidden_size, config.rms_norm_eps, backend),
            rope_cos_sin_table(config, max_seq_len),
        )
        mtp_kinds = config.mtp.mlp_layer_types if config.mtp is not None else ()
        self.mtp_layers = nn.ModuleList(
            Glm4MoeMtpLayer(config, config.num_hidden_layers + k, kind == SPARSE, backend)
            for k, kind in enumerate(mtp_kinds)
        )


class Glm4MoeForCausalLM(MtpCausalLM):
    """Model type ``glm4_moe`` (see :class:`CausalLM` and this module's docstring)."""

    model: Glm4MoeModel

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        check_glm4_moe_config(config)

    def build_model(self) -> Glm4MoeModel:
        model = Glm4MoeModel(self.config, self.max_seq_len, self.backend)
        log_mtp_layers(self.config.model_type, len(model.mtp_layers))
        return model


def check_glm4_moe_config(config: ModelConfig) -> None:
    """Raise ``ValueError`` naming what this family cannot run in ``config``."""
    require_moe(config)
    # Partial rotary is this family's own; every other llama switch must be plain.
    plain = attrs.evolve(config, partial_rotary_factor=1.0)
    check_supported(plain, tuple(f for f in UNSUPPORTED_FEATURES if f != "moe"))
    if config.rope_scaling is not None:
        # GLM-4.5 / 4.6 use plain RoPE; scaled partial rotary is not checked against transformers.
        raise ValueError(
            f"{config.source}: glm4_moe with rope_type {config.rope_scaling.rope_type!r} is not "
            "supported (plain RoPE only)"
        )
    if config.mlp_bias or config.o_proj_bias:
        raise ValueError(f"{config.model_type}: MLP or o_proj biases are not supported")
    mtp = config.mtp
    if mtp is not None and len(mtp.mlp_layer_types) != mtp.num_layers:
        raise ValueError(
            f"{config.source}: {mtp.num_layers} MTP layers but {len(mtp.mlp_layer_types)} "
            "MTP MLP kinds"
        )


_LAYER = re.compile(r"model\.layers\.(?P<layer>\d+)\.(?P<rest>.+)")
_ROUTER = re.compile(r"mlp\.gate\.(?:weight|e_score_correction_bias)")
_MTP_COPIES = ("embed_tokens.weight", "shared_head.head.weight")


def glm4_moe_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    """The MoE families' names (per-expert projections stacked, q/k/v and gate/up fused), the
    router and its correction bias kept float32, and MTP layer ``num_hidden_layers + k`` moved
    to ``model.mtp_layers.k`` (its copies of the embedding and LM head skipped); MTP layers
    past ``num_nextn_predict_layers`` (0 serves without them) are skipped, as transformers
    skips them all."""
    routed = moe_checkpoint_mapping(config)
    num_layers = config.num_hidden_layers
    num_mtp = config.mtp.num_layers if config.mtp is not None else 0

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        layer = _LAYER.fullmatch(name)
        if layer is None:
            return routed(name, shape)
        index, rest = int(layer["layer"]), layer["rest"]
        if index >= num_layers + num_mtp:
            return Skip(f"layer {index}: an MTP layer beyond num_nextn_predict_layers")
        if index >= num_layers and rest in _MTP_COPIES:
            return Skip(f"MTP layer {index}: a copy of the target's embedding or LM head")
        mapped = routed(name, shape)
        if _ROUTER.fullmatch(rest) and isinstance(mapped, TensorTarget):
            mapped = attrs.evolve(mapped, keep_float32=True)
        if index < num_layers or not isinstance(mapped, TensorTarget):
            return mapped
        old_prefix = f"model.layers.{index}."
        assert mapped.param.startswith(old_prefix)
        moved = f"{MTP_LAYERS}.{index - num_layers}.{mapped.param[len(old_prefix) :]}"
        return attrs.evolve(mapped, param=moved)

    return target
