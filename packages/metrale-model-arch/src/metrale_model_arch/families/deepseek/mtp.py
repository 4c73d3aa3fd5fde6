"""DeepSeek-V3's multi-token-prediction layer (vLLM's ``deepseek_mtp``).

MTP layer ``k`` is checkpoint layer ``num_hidden_layers + k``: ``enorm`` and ``hnorm``
(RMSNorm), ``eh_proj (hidden, 2 * hidden)``, one decoder block (MLA attention over its own
paged latent, its MLP by the stack's rule: DeepSeek's MoE past ``first_k_dense_replace``) and
``shared_head.norm``; the embedding and the LM head are the target's (the checkpoint's copies,
``embed_tokens`` and ``shared_head.head``, are skipped). ``h_i`` is the target's final hidden
state at position ``i``::

    h' = Block(eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)]))
    logits = lm_head(shared_head.norm(h'))
"""

from __future__ import annotations

import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.families.base import LayerCache
from metrale_model_arch.families.deepseek.decoder_layer import DeepseekDecoderLayer
from metrale_model_arch.families.llama import RMSNorm


class SharedHead(nn.Module):
    def __init__(self, config: ModelConfig, backend: KernelBackend) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)


class DeepseekMtpLayer(DeepseekDecoderLayer):
    """The block's weights are this class's own (as a decoder layer's), with ``enorm``,
    ``hnorm``, ``eh_proj`` and ``shared_head.norm`` beside them."""

    def __init__(self, config: ModelConfig, is_sparse: bool, backend: KernelBackend) -> None:
        super().__init__(config, is_sparse, backend)
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
        latent_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """``embeds``, ``previous_hidden`` ``(tokens, hidden)`` -> ``h' (tokens, hidden)``."""
        joined = torch.cat((self.enorm(embeds), self.hnorm(previous_hidden)), dim=-1)
        out: torch.Tensor = self(self.eh_proj(joined), positions, cos_sin, latent_cache, metadata)
        return out
