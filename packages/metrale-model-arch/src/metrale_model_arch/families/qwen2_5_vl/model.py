"""Qwen2.5-VL's text model (``qwen2_5_vl``) over a paged KV cache, its vision tower beside it.

The layers are Qwen2's (llama's, with q/k/v biases); they turn q and k by M-RoPE
(:mod:`.mrope`). ``forward`` takes ``(tokens,)`` positions (text alone, and every token decoded
after a prompt: its sequence index plus the prompt's delta, :mod:`.positions`) or ``(3, tokens)``
ones (a step that prefills image tokens; the other tokens' three rows are equal). The tower is
``model.visual``: :mod:`.vision.placement` gives ``forward`` its ``inputs_embeds``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.cache_spec import layer_sliding_window
from metrale_model_arch.families.base import LayerCache, LayerState
from metrale_model_arch.families.decoder_stack import DecoderStack, EagerCausalLM
from metrale_model_arch.families.llama import (
    LlamaDecoderLayer,
    LlamaMLP,
    RMSNorm,
    check_supported,
)
from metrale_model_arch.families.qwen2_5_vl.mrope import mrope_cos_sin
from metrale_model_arch.families.qwen2_5_vl.vision.tower import Qwen2_5_VisionModel
from metrale_model_arch.families.rotary import rope_cos_sin_table


class Qwen2_5_VLModel(DecoderStack):  # noqa: N801 (transformers' name)
    """The text stack (``model.*``) and, when the config declares one, the tower
    (``model.visual``)."""

    def __init__(
        self,
        config: ModelConfig,
        layers: Iterable[LlamaDecoderLayer],
        max_seq_len: int,
        backend: KernelBackend,
    ) -> None:
        # NOTE: a prompt's M-RoPE positions never pass its length (an image of n tokens moves
        # the text after it on by at most n), so the plain table's rows cover them.
        norm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)
        super().__init__(config, layers, norm, rope_cos_sin_table(config, max_seq_len))
        vision = config.vision
        self.visual = Qwen2_5_VisionModel(vision, backend) if vision is not None else None


class Qwen2_5_VLForCausalLM(EagerCausalLM):  # noqa: N801 (transformers' name)
    """Model type ``qwen2_5_vl`` (see :class:`CausalLM` and this module's docstring)."""

    model: Qwen2_5_VLModel

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        check_supported(config)
        if len(config.mrope_section) != 3 or sum(config.mrope_section) != config.head_dim // 2:
            raise ValueError(
                f"{config.source}: mrope_section {list(config.mrope_section)} must be three "
                f"sizes summing to head_dim // 2 ({config.head_dim // 2})"
            )
        vision = config.vision
        if vision is not None and vision.out_hidden_size != config.hidden_size:
            raise ValueError(
                f"{config.source}: vision_config.out_hidden_size ({vision.out_hidden_size}) "
                f"must equal the text hidden_size ({config.hidden_size})"
            )

    def build_model(self) -> Qwen2_5_VLModel:
        config, backend = self.config, self.backend
        layers = (
            LlamaDecoderLayer(
                config, layer_sliding_window(config, i), backend, LlamaMLP(config, backend)
            )
            for i in range(config.num_hidden_layers)
        )
        return Qwen2_5_VLModel(config, layers, self.max_seq_len, backend)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[LayerCache],
        metadata: AttentionMetadata,
        states: Sequence[LayerState] = (),
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``positions`` ``(tokens,)`` or ``(3, tokens)``; ``inputs_embeds (tokens, hidden)``,
        when given, stand for ``input_ids``' embeddings."""
        del states  # no per-sequence state
        layers = self.model.layers
        if len(kv_caches) != len(layers):
            raise ValueError(f"{len(kv_caches)} KV caches for {len(layers)} layers")
        cos_sin, rows = self.model.cos_sin_cache, positions
        if positions.dim() == 2:
            cos_sin = mrope_cos_sin(cos_sin, positions, self.config.mrope_section)
            rows = torch.arange(positions.shape[1], device=positions.device)
        hidden = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        for layer, kv_cache in zip(layers, kv_caches, strict=True):
            hidden = layer(hidden, rows, cos_sin, kv_cache, metadata)
        out: torch.Tensor = self.model.norm(hidden)
        return out
