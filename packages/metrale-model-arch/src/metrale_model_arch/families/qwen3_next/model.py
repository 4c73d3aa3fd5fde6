"""Qwen3-Next (``qwen3_next``) over a paged cache and linear-state slots.

Layers are Gated DeltaNet linear attention (:mod:`.gated_deltanet`) or gated full attention
where ``layer_types`` says: q/k RMSNorms per head, RoPE over the leading
``partial_rotary_factor`` of each head, the output times ``sigmoid`` of a gate that the q
projection computes beside each query head. Every layer's FFN is the routed MoE plus one shared
expert scaled by its own sigmoid gate (a dense SwiGLU MLP on ``mlp_only_layers``). Every
RMSNorm but the linear layers' gated one scales by ``1 + weight``.

A checkpoint's multi-token-prediction layers (``mtp.*``) are loaded into ``model.mtp_layers``
(:mod:`.mtp`), owned by ``weights.mtp`` in the memory plan, when the config keeps them (MTP
speculation; else :func:`~metrale_model_arch.mtp_free_config` drops them and they are skipped);
MTP speculation runs the first (``forward_mtp``).

It runs eagerly over a :class:`~metrale_model_arch.families.decoder_stack.DecoderStack`, never
through the compiled or native llama executors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from metrale_config import FULL_ATTENTION, ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.counts.moe import require_moe
from metrale_model_arch.families.base import LayerCache, LayerState
from metrale_model_arch.families.decoder_stack import DecoderStack
from metrale_model_arch.families.mtp_causal_lm import MtpCausalLM, log_mtp_layers
from metrale_model_arch.families.qwen3_next.decoder_layer import (
    Qwen3NextDecoderLayer,
    centred_norm,
)
from metrale_model_arch.families.qwen3_next.mtp import mtp_layer
from metrale_model_arch.families.rotary import rope_cos_sin_table
from metrale_model_arch.families.row_invariant_layers import head_logits

SUPPORTED_HIDDEN_ACTS = ("silu",)


class Qwen3NextModel(DecoderStack):
    def __init__(self, config: ModelConfig, max_seq_len: int, backend: KernelBackend) -> None:
        # cos_sin_cache: (max_seq_len, rotary_dim), plain RoPE over the rotated part.
        super().__init__(
            config,
            (Qwen3NextDecoderLayer(config, i, backend) for i in range(config.num_hidden_layers)),
            centred_norm(config, config.hidden_size, backend),
            rope_cos_sin_table(config, max_seq_len),
        )
        num_mtp = config.mtp.num_layers if config.mtp is not None else 0
        self.mtp_layers = nn.ModuleList(mtp_layer(config, k, backend) for k in range(num_mtp))


class Qwen3NextForCausalLM(MtpCausalLM):
    """Model type ``qwen3_next`` (see :class:`CausalLM` and this module's docstring)."""

    model: Qwen3NextModel

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        check_qwen3_next_config(config)

    def build_model(self) -> Qwen3NextModel:
        model = Qwen3NextModel(self.config, self.max_seq_len, self.backend)
        log_mtp_layers(self.config.model_type, len(model.mtp_layers))
        return model

    def compute_mtp_logits(
        self, hidden: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The target's head over ``forward_mtp``'s output, already through ``mtp.norm``."""
        return head_logits(self.lm_head, hidden, out)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[LayerCache],
        metadata: AttentionMetadata,
        states: Sequence[LayerState] = (),
    ) -> torch.Tensor:
        layers = cast("Sequence[Qwen3NextDecoderLayer]", self.model.layers)
        if len(kv_caches) != len(layers) or len(states) != len(layers):
            raise ValueError(
                f"{len(kv_caches)} KV caches and {len(states)} states for {len(layers)} layers"
            )
        cos_sin = self.model.cos_sin_cache
        hidden = self.embed(input_ids)
        for layer, kv_cache, state in zip(layers, kv_caches, states, strict=True):
            hidden = layer(hidden, positions, cos_sin, kv_cache, state, metadata)
        out: torch.Tensor = self.model.norm(hidden)
        return out


def check_qwen3_next_config(config: ModelConfig) -> None:
    """Raise ``ValueError`` naming what this family cannot run in ``config``."""
    if config.hidden_act not in SUPPORTED_HIDDEN_ACTS:
        raise ValueError(
            f"unsupported hidden_act {config.hidden_act!r} for {config.model_type}; "
            f"supported: {', '.join(SUPPORTED_HIDDEN_ACTS)}"
        )
    require_moe(config)
    linear = config.linear_attention
    if linear is None:
        raise ValueError(f"{config.source}: a qwen3_next config needs its linear attention fields")
    if linear.num_heads % linear.num_key_heads:
        raise ValueError(
            f"{config.source}: {linear.num_heads} linear value heads do not divide into "
            f"{linear.num_key_heads} key heads"
        )
    if config.rope_scaling is not None:
        raise ValueError(
            f"{config.source}: qwen3_next with rope_type {config.rope_scaling.rope_type!r} is "
            "not supported (plain RoPE only)"
        )
    if config.mlp_bias or config.sliding_window is not None:
        raise ValueError(f"{config.source}: qwen3_next with MLP biases or a sliding window")
    mtp = config.mtp
    if mtp is None:
        return
    if len(mtp.mlp_layer_types) != mtp.num_layers or any(
        kind != FULL_ATTENTION for kind in mtp.layer_types
    ):
        raise ValueError(
            f"{config.source}: {mtp.num_layers} qwen3_next MTP layers need as many MLP kinds "
            f"(got {len(mtp.mlp_layer_types)}) and full-attention layers only"
        )
    if FULL_ATTENTION not in config.layer_types:
        # The draft pool pages the MTP layer's K/V as the stack's full-attention layers do.
        raise ValueError(
            f"{config.source}: qwen3_next MTP layers with no full-attention layer in the stack"
        )
