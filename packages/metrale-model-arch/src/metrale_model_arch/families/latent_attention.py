"""Multi-head latent attention's shared part: ``kv_b_proj``, absorbed into the queries.

An MLA layer caches one latent per token (``kv_lora_rank`` wide, after ``kv_a_layernorm``;
DeepSeek appends its rotated RoPE key). Per head, rows of ``kv_b_proj`` expand the latent
into that head's no-RoPE key, then its value. Attention runs in latent space: each head's
query is absorbed through its key rows (``q~ = W_UK^T q``), scores are ``q~ . c``, and the
weighted latent is expanded by the value rows (``W_UV``): the math of expanding K and V,
without materialising them.
"""

from __future__ import annotations

import torch
from torch import nn


class LatentExpansion(nn.Module):
    """``kv_b_proj``: only its per-head slices are used, never as one matmul, so it is not an
    ``nn.Linear`` (whose weight a CPU build stores transposed)."""

    def __init__(self, num_heads: int, nope_dim: int, v_dim: int, latent_dim: int) -> None:
        super().__init__()
        self.num_heads, self.nope_dim = num_heads, nope_dim
        self.weight = nn.Parameter(torch.empty(num_heads * (nope_dim + v_dim), latent_dim))

    def _per_head(self) -> torch.Tensor:
        # (heads, nope + v, latent): per head, the rows that expand the latent into k, then v.
        return self.weight.view(self.num_heads, -1, self.weight.shape[-1])

    def absorb(self, q_nope: torch.Tensor) -> torch.Tensor:
        """``(tokens, heads, nope_dim)`` queries -> ``(tokens, heads, latent_dim)``."""
        return torch.einsum("thd,hdr->thr", q_nope, self._per_head()[:, : self.nope_dim])

    def expand(self, attended: torch.Tensor) -> torch.Tensor:
        """``(tokens, heads, latent_dim)`` attended latents -> ``(tokens, heads, v_dim)``."""
        return torch.einsum("thr,hvr->thv", attended, self._per_head()[:, self.nope_dim :])


def write_latent(cache: torch.Tensor, latent: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store each token's ``latent (tokens, width)`` at its slot of ``cache (blocks,
    block_size, width)``."""
    cache.view(-1, cache.shape[-1])[slot_mapping] = latent
