"""GLM-5.3's multi-token-prediction layer (DeepSeek-V3's layout, as GLM-4.5 and vLLM have it).

MTP layer ``k`` is checkpoint layer ``num_hidden_layers + k``: ``enorm`` and ``hnorm`` (RMSNorm),
``eh_proj (hidden, 2 * hidden)``, one decoder block of the type ``mtp_layer_types[k]`` names (a
DSA layer with its own indexer; the FFN the MoE unless the config says dense) and
``shared_head.norm``; the embedding and the LM head are the target's. The block runs with one
stream: its hyper-connections are those of ``hc_mult = 1``. ``h_i`` is the target's final hidden
state at position ``i`` (its streams' mean, then its final norm)::

    h' = Block(eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)]))
    logits = lm_head(shared_head.norm(h'))

The block's DSA indexer is per sequence (the proposer's state: a flat indexer of one layer),
its latent paged in the draft pool.
"""

from __future__ import annotations

import attrs
import torch
from torch import nn

from metrale_config import SPARSE_ATTENTION, ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.counts.glm5_next import mtp_layer
from metrale_model_arch.families.base import LayerCache, LayerState
from metrale_model_arch.families.glm5_next.decoder_layer import Glm5NextDecoderLayer
from metrale_model_arch.families.llama import RMSNorm
from metrale_model_arch.glm5_next_skeleton import SkeletonLayer


class SharedHead(nn.Module):
    def __init__(self, config: ModelConfig, backend: KernelBackend) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)


def one_stream_config(config: ModelConfig) -> ModelConfig:
    """``config`` with hyper-connections over a single stream (what the MTP block runs)."""
    assert config.mhc is not None
    return attrs.evolve(config, mhc=attrs.evolve(config.mhc, num_streams=1))


def mtp_skeleton_layer(config: ModelConfig, k: int) -> SkeletonLayer:
    """MTP layer ``k``'s block: a DSA layer with its own indexer; ``ValueError`` for another
    mixer (a linear-attention drafter would need its own recurrent state)."""
    assert config.mtp is not None
    kinds = config.mtp.layer_types
    if k < len(kinds) and kinds[k] != SPARSE_ATTENTION:
        raise ValueError(
            f"{config.source}: glm5_next MTP layer {k} is {kinds[k]!r}; only a sparse-attention "
            "(DSA) MTP layer is supported"
        )
    return mtp_layer(config, k)


class Glm5NextMtpLayer(Glm5NextDecoderLayer):
    """The block's weights are this class's own (as a decoder layer's), with ``enorm``,
    ``hnorm``, ``eh_proj`` and ``shared_head.norm`` beside them."""

    def __init__(self, config: ModelConfig, k: int, backend: KernelBackend) -> None:
        super().__init__(one_stream_config(config), mtp_skeleton_layer(config, k), backend)
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
        cache: LayerCache,
        state: LayerState,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """``embeds``, ``previous_hidden`` ``(tokens, hidden)`` -> ``h' (tokens, hidden)``."""
        joined = torch.cat((self.enorm(embeds), self.hnorm(previous_hidden)), dim=-1)
        streams = self.eh_proj(joined).unsqueeze(1)  # (tokens, 1 stream, hidden)
        out, _ = self(streams, positions, cache, state, metadata, None)
        squeezed: torch.Tensor = out.squeeze(1)
        return squeezed
