"""``MtpCausalLM``: an eager causal LM whose stack holds DeepSeek-convention MTP layers
(glm4_moe, DeepSeek-V3): ``model.mtp_layers``, each with ``forward_mtp(embeds, previous_hidden,
positions, cos_sin, kv_cache, metadata)`` and a ``shared_head.norm``, keeping nothing per
sequence (attention whose K/V is paged); the embedding, RoPE table and head are the target's."""

from __future__ import annotations

import logging
from typing import Any, cast

import torch
from torch import nn

from metrale_kernels import AttentionMetadata
from metrale_model_arch.families.base import LayerCache, LayerState
from metrale_model_arch.families.decoder_stack import EagerCausalLM
from metrale_model_arch.families.row_invariant_layers import head_logits

logger = logging.getLogger("metrale.load")


def log_mtp_layers(model_type: str, count: int) -> None:
    """Says, at load, when a stack holds MTP layers (they are loaded only to draft)."""
    if count:
        logger.info(
            "%s: %d MTP layer(s) loaded (weights.mtp) for MTP speculation", model_type, count
        )


class MtpCausalLM(EagerCausalLM):
    @property
    def num_mtp_layers(self) -> int:
        return len(self._mtp_layers)

    def forward_mtp(
        self,
        input_ids: torch.Tensor,
        previous_hidden: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
        state: LayerState = (),
    ) -> torch.Tensor:
        del state  # the layer's attention keeps nothing per sequence
        embeds = self.model.embed_tokens(input_ids)
        out: torch.Tensor = self._first_mtp_layer.forward_mtp(
            embeds, previous_hidden, positions, self.model.cos_sin_cache, kv_cache, metadata
        )
        return out

    def compute_mtp_logits(
        self, hidden: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return head_logits(self.lm_head, self._first_mtp_layer.shared_head.norm(hidden), out)

    @property
    def _mtp_layers(self) -> nn.ModuleList:
        return cast("nn.ModuleList", self.model.mtp_layers)

    @property
    def _first_mtp_layer(self) -> Any:
        return self._mtp_layers[0]
