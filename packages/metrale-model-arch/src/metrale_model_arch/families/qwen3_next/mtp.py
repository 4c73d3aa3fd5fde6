"""Qwen3-Next's multi-token-prediction layers (vLLM's ``qwen3_next_mtp``).

A checkpoint holds them under ``mtp.``: ``pre_fc_norm_embedding`` and ``pre_fc_norm_hidden``
(Qwen3-Next's ``(1 + w)`` RMSNorms), ``fc (hidden, 2 * hidden)``, ``layers.{k}.*`` (a
full-attention decoder layer, named as a stack layer is, its FFN by the stack's rule at index
``k``) and ``norm``; the embedding and the LM head are the target's. ``fc`` and the three norms
are the predictor's, shared by its layers; here they live in MTP layer 0 (the one speculation
runs), so every MTP parameter is under ``model.mtp_layers.`` (owner ``weights.mtp``). ``h_i``
is the target's final hidden state at position ``i``::

    h' = norm(Block(fc([pre_fc_norm_embedding(embed(t_{i+1})); pre_fc_norm_hidden(h_i)])))
    logits = lm_head(h')

``forward_mtp`` returns ``h'`` after ``norm``, as vLLM's predictor does: a further draft reads
that normed output as its previous hidden state.
"""

from __future__ import annotations

import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.counts.moe import SPARSE
from metrale_model_arch.families.base import LayerCache
from metrale_model_arch.families.qwen3_next.decoder_layer import (
    Qwen3NextDecoderLayer,
    centred_norm,
)


class Qwen3NextMtpBlock(Qwen3NextDecoderLayer):
    """MTP layer ``k``'s decoder block: gated full attention, the FFN the config gives it."""

    def __init__(self, config: ModelConfig, k: int, backend: KernelBackend) -> None:
        assert config.mtp is not None
        super().__init__(
            config,
            config.num_hidden_layers + k,
            backend,
            is_linear=False,
            is_sparse=config.mtp.mlp_layer_types[k] == SPARSE,
        )


class Qwen3NextMtpLayer(Qwen3NextMtpBlock):
    """MTP layer 0: its block's weights are this class's own (as a decoder layer's), with the
    predictor's ``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``, ``fc`` and ``norm`` beside
    them."""

    def __init__(self, config: ModelConfig, backend: KernelBackend) -> None:
        super().__init__(config, 0, backend)
        hidden = config.hidden_size
        self.pre_fc_norm_embedding = centred_norm(config, hidden, backend)
        self.pre_fc_norm_hidden = centred_norm(config, hidden, backend)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.norm = centred_norm(config, hidden, backend)

    def forward_mtp(
        self,
        embeds: torch.Tensor,
        previous_hidden: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """``embeds``, ``previous_hidden`` ``(tokens, hidden)`` -> ``h' (tokens, hidden)``."""
        joined = torch.cat(
            (self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(previous_hidden)), dim=-1
        )
        out = self(self.fc(joined), positions, cos_sin, kv_cache, (), metadata)
        normed: torch.Tensor = self.norm(out)
        return normed


def mtp_layer(config: ModelConfig, k: int, backend: KernelBackend) -> Qwen3NextMtpBlock:
    """MTP layer ``k`` as ``model.mtp_layers.k`` holds it: layer 0 with the predictor's own
    weights, any later one its block alone (loaded and priced; speculation runs layer 0)."""
    return Qwen3NextMtpLayer(config, backend) if k == 0 else Qwen3NextMtpBlock(config, k, backend)
