"""DeepSeek-V3.2's attention: DeepSeek's MLA (:mod:`.attention`) over only the positions its
lightning indexer selects per query (GLM-5.3's indexer with single-token pools and RoPE,
:class:`~metrale_model_arch.families.glm5_next.dsa_attention.Indexer`).

A query with at most ``index_topk`` positions before it attends to all of them (dense). The
layer's cache is ``(latent, index_keys)``: the latent rows of :class:`.attention.MlaAttention`
and each token's rotated, normed indexer key.
"""

from __future__ import annotations

import torch

from metrale_config import DsaConfig, MlaConfig, ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_model_arch.families.deepseek.attention import MlaAttention, deinterleave
from metrale_model_arch.families.glm5_next.dsa_attention import (
    Indexer,
    attend_selected,
    indexer_rows,
)
from metrale_model_arch.families.latent_attention import write_latent


class SparseMlaAttention(MlaAttention):
    def __init__(
        self, config: ModelConfig, mla: MlaConfig, dsa: DsaConfig, backend: KernelBackend
    ) -> None:
        super().__init__(config, mla, backend)
        if mla.q_lora_rank is None or not mla.is_rotary:
            raise ValueError("deepseek_v32 attention needs q_lora_rank and rotary MLA")
        self.indexer = Indexer(
            config.hidden_size,
            mla.q_lora_rank,
            dsa,
            rope_dim=mla.qk_rope_head_dim,
            has_pool_gate=False,
        )

    def forward_sparse(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        cache: tuple[torch.Tensor, ...],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Normed ``x (tokens, hidden)`` -> ``(tokens, hidden)``; writes the step's latent rows
        and indexer keys into ``cache``."""
        assert self.q_a_proj is not None
        assert self.q_a_layernorm is not None
        assert self.q_b_proj is not None
        latent_cache = cache[0]
        q_latent = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(q_latent).view(x.shape[0], self.num_heads, -1)
        q_nope, q_rope = torch.split(q, self.qk_split, dim=-1)
        latent, k_rope = torch.split(
            self.kv_a_proj_with_mqa(x), [self.latent_dim, self.rope_dim], dim=-1
        )
        if self.is_interleaved:
            q_rope, k_rope = deinterleave(q_rope), deinterleave(k_rope)
        q_rope, k_rope = self.backend.apply_rotary(q_rope, k_rope[:, None], positions, cos_sin)
        rows = torch.cat([self.kv_a_layernorm(latent), k_rope[:, 0]], dim=-1)
        write_latent(latent_cache, rows, metadata.slot_mapping)
        selections = self.indexer.select(
            x,
            q_latent,
            positions,
            indexer_rows(cache, (), metadata, self.indexer.kpool),
            metadata,
            self.backend,
            cos_sin,
        )
        queries = torch.cat([self.kv_b_proj.absorb(q_nope), q_rope], dim=-1)
        attended = attend_selected(
            self.backend, queries, latent_cache, metadata, selections, self.scale
        )
        out = self.kv_b_proj.expand(attended[..., : self.latent_dim])
        projected: torch.Tensor = self.o_proj(out.flatten(1))
        return projected
