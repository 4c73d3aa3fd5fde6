"""Gemma 3 with images (``gemma3``, transformers' ``Gemma3ForConditionalGeneration``).

The text stack is ``gemma3_text``'s (:mod:`~metrale_model_arch.families.dense_variants`), run
eagerly; the checkpoint's SigLIP tower and projector are ``model.visual``
(:class:`~.vision.visual.Gemma3Visual`), run by :func:`.vision.placement.prompt_embeds`, which
gives ``forward`` its ``inputs_embeds``.

Image tokens attend to their whole image (:mod:`.image_attention`) in this eager ``forward`` (the
only executor the dense variants have), on any kernel backend (the masked path is torch ops),
in a step where a sequence has several rows holding image tokens: a prompt's prefill, or a chunk
of it that holds whole images. Decode steps, and every step when ``image_token_id`` is ``None``
(a text-only load), keep the backend's causal paged attention. The engine takes images only
for the families :mod:`metrale_model_arch.image_encoder` serves; this is not one yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.families.base import LayerCache, LayerState
from metrale_model_arch.families.decoder_stack import DecoderStack
from metrale_model_arch.families.dense_variants import (
    DenseVariantForCausalLM,
    VariantAttention,
    VariantDecoderLayer,
)
from metrale_model_arch.families.gemma3.image_attention import (
    ImagePromptMetadata,
    image_prompt_attention,
    with_image_spans,
)
from metrale_model_arch.families.gemma3.vision.visual import Gemma3Visual


class Gemma3Attention(VariantAttention):
    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        if not isinstance(metadata, ImagePromptMetadata):
            return super().attend(q, k, v, kv_cache, metadata)
        metadata = metadata.for_window(self.sliding_window)
        assert isinstance(metadata, ImagePromptMetadata)  # its window views carry the spans
        k_cache, v_cache = kv_cache
        self.backend.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        return image_prompt_attention(
            q, k_cache, v_cache, metadata, self.scale, self.sliding_window, softcap=self.softcap
        )


class Gemma3ForConditionalGeneration(DenseVariantForCausalLM):
    """Model type ``gemma3`` (see this module's docstring); without ``config.siglip_vision``
    (a text-only load) it is ``gemma3_text``'s model under ``gemma3``'s names."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        max_seq_len: int | None = None,
        backend: KernelBackend | None = None,
    ) -> None:
        super().__init__(config, max_seq_len=max_seq_len, backend=backend)
        vision = config.siglip_vision
        # The token whose runs are images; None: every step attends causally.
        self.image_token_id = None if vision is None else vision.image_token_id

    def build_model(self) -> DecoderStack:
        config, backend = self.config, self.backend
        stack = super().build_model()
        # gemma3_text's layers, each attention swapped for one that reads the image spans.
        for index, layer in enumerate(cast("Sequence[VariantDecoderLayer]", stack.layers)):
            layer.self_attn = Gemma3Attention(config, index, backend)
        vision = config.siglip_vision
        visual = None if vision is None else Gemma3Visual(vision, config.hidden_size, backend)
        stack.add_module("visual", visual)
        return stack

    @property
    def visual(self) -> Gemma3Visual | None:
        return cast("Gemma3Visual | None", self.model.visual)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[LayerCache],
        metadata: AttentionMetadata,
        states: Sequence[LayerState] = (),
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``inputs_embeds (tokens, hidden)``, when given, stand for ``input_ids``' embeddings;
        ``input_ids`` still say where the images are."""
        del states  # no per-sequence state
        layers = self.model.layers
        if len(kv_caches) != len(layers):
            raise ValueError(f"{len(kv_caches)} KV caches for {len(layers)} layers")
        if self.image_token_id is not None:
            metadata = with_image_spans(metadata, input_ids, self.image_token_id)
        cos_sin = self.model.cos_sin_cache
        hidden = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        for layer, rows, kv_cache in zip(layers, self.rope_rows(positions), kv_caches, strict=True):
            hidden = layer(hidden, rows, cos_sin, kv_cache, metadata)
        out: torch.Tensor = self.model.norm(hidden)
        return out
