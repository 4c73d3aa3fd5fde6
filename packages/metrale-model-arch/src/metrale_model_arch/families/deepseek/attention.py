"""DeepSeek's multi-head latent attention (MLA) over a paged latent cache.

Each token caches ``kv_lora_rank + qk_rope_head_dim`` values: its normed latent, then its
rotated RoPE key (one for all heads). Queries come from ``q_proj`` (``q_lora_rank`` null:
V2-Lite) or the ``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj`` low-rank path. A head's score
is its absorbed no-RoPE query against the latent plus its RoPE query against the RoPE key: one
dot product with the cached row, so attention is multi-query attention over the cache with
the row as key and value; the value's latent part is expanded by ``kv_b_proj``
(:mod:`~metrale_model_arch.families.latent_attention`).

DeepSeek rotates adjacent pairs of the RoPE dims (``rope_interleave``). Here q and k are
de-interleaved (even dims, then odd) and rotated as halves: the same rotation of the same
pairs, and scores see q and k in the same order.

DeepSeek's YaRN (the table: :func:`~metrale_model_arch.families.rotary.
rope_or_yarn_cos_sin_table`) also scales the softmax by ``mscale(factor, mscale_all_dim) ** 2``,
on every dim, RoPE or not (:func:`mla_softmax_scale`).

Kimi Linear's MLA (``MlaConfig.is_rotary`` false) caches and scores its RoPE dims unrotated.
"""

from __future__ import annotations

import torch
from torch import nn

from metrale_config import MlaConfig, ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.families.latent_attention import LatentExpansion, write_latent
from metrale_model_arch.families.llama import RMSNorm
from metrale_model_arch.families.rotary import yarn_mscale

# transformers' q_a_layernorm and kv_a_layernorm take their default eps, not the config's.
LATENT_NORM_EPS = 1e-6


def mla_softmax_scale(config: ModelConfig) -> float:
    """``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``, times ``mscale(factor,
    mscale_all_dim) ** 2`` under a rope scaling that sets ``mscale_all_dim``."""
    scale: float = config.head_dim**-0.5
    scaling = config.rope_scaling
    if scaling is not None and scaling.mscale_all_dim:
        scale *= yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2
    return scale


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """``(..., 2n)`` pairs ``(x0, x1), (x2, x3)...`` -> ``(x0, x2, ..., x1, x3, ...)``."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


class MlaAttention(nn.Module):
    def __init__(self, config: ModelConfig, mla: MlaConfig, backend: KernelBackend) -> None:
        super().__init__()
        hidden, heads, eps = config.hidden_size, config.num_attention_heads, LATENT_NORM_EPS
        self.num_heads = heads
        self.latent_dim, self.rope_dim = mla.kv_lora_rank, mla.qk_rope_head_dim
        self.qk_split = [mla.qk_nope_head_dim, mla.qk_rope_head_dim]
        self.is_interleaved = mla.rope_interleave
        self.is_rotary = mla.is_rotary
        self.scale = mla_softmax_scale(config)
        self.backend = backend
        q_rows = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
        self.q_proj: nn.Linear | None = None
        self.q_a_proj: nn.Linear | None = None
        self.q_a_layernorm: RMSNorm | None = None
        self.q_b_proj: nn.Linear | None = None
        if mla.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, q_rows, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, mla.q_lora_rank, bias=config.qkv_bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, eps, backend)
            self.q_b_proj = nn.Linear(mla.q_lora_rank, q_rows, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(
            hidden, mla.kv_lora_rank + mla.qk_rope_head_dim, bias=config.qkv_bias
        )
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, eps, backend)
        self.kv_b_proj = LatentExpansion(
            heads, mla.qk_nope_head_dim, mla.v_head_dim, mla.kv_lora_rank
        )
        self.o_proj = nn.Linear(heads * mla.v_head_dim, hidden, bias=config.o_proj_bias)

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_proj is not None:
            q: torch.Tensor = self.q_proj(x)
        else:
            assert self.q_a_proj is not None
            assert self.q_a_layernorm is not None
            assert self.q_b_proj is not None
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return q.view(x.shape[0], self.num_heads, -1)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        latent_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Normed ``x (tokens, hidden)`` -> ``(tokens, hidden)``; writes the step's rows into
        ``latent_cache (blocks, block_size, kv_lora_rank + qk_rope_head_dim)``."""
        q_nope, q_rope = torch.split(self.project_q(x), self.qk_split, dim=-1)
        latent, k_rope = torch.split(
            self.kv_a_proj_with_mqa(x), [self.latent_dim, self.rope_dim], dim=-1
        )
        if self.is_rotary:
            if self.is_interleaved:
                q_rope, k_rope = deinterleave(q_rope), deinterleave(k_rope)
            # k_rope as (tokens, 1, rope_dim): one key head.
            q_rope, k_rope = self.backend.apply_rotary(q_rope, k_rope[:, None], positions, cos_sin)
            k_rope = k_rope[:, 0]
        rows = torch.cat([self.kv_a_layernorm(latent), k_rope], dim=-1)
        write_latent(latent_cache, rows, metadata.slot_mapping)
        queries = torch.cat([self.kv_b_proj.absorb(q_nope), q_rope], dim=-1)
        # (blocks, block_size, 1, latent + rope): the one key head, and its value.
        keys = latent_cache.unsqueeze(2)
        attended = self.backend.paged_attention(queries, keys, keys, metadata, self.scale)
        out = self.kv_b_proj.expand(attended[..., : self.latent_dim])
        projected: torch.Tensor = self.o_proj(out.flatten(1))
        return projected
