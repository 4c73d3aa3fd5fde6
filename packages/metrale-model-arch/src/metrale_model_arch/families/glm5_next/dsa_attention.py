"""DSA layers: MLA without RoPE, attending only to the positions a lightning indexer selects.

The paged cache holds the ``kv_lora_rank`` latent of every token (after ``kv_a_layernorm``);
attention runs in latent space (:mod:`~metrale_model_arch.families.latent_attention`).

The indexer (on "full" layers) scores each query against pooled keys (one per complete pool of
``index_kpool`` tokens) and selects the best ``index_topk / index_kpool`` pools plus the
query's own incomplete pool (the tail); a "shared" layer reuses the selection of the full layer
right before it. See :mod:`.indexer_cache` for where the pooled keys live.

DeepSeek-V3.2's indexer (``rope_dim`` > 0, no pooling gate) is this one with single-token
pools: it rotates the first ``rope_dim`` dims of its queries and keys (half-split, with the
model's RoPE table) and needs no pooling parameters (a pool of one token is that token).
"""

from __future__ import annotations

import torch
from torch import nn

from metrale_config import DsaConfig, MlaConfig
from metrale_kernels import AttentionMetadata, KernelBackend, widened
from metrale_model_arch.families.glm5_next.indexer_cache import IndexerRows
from metrale_model_arch.families.latent_attention import LatentExpansion, write_latent
from metrale_model_arch.families.llama import RMSNorm

# The indexer key's LayerNorm epsilon (not rms_norm_eps).
INDEX_KEY_NORM_EPS = 1e-6
# Per sequence of a step: (its query tokens, the positions each attends to), see select_positions.
Selections = list[torch.Tensor]


class Indexer(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        q_lora_rank: int,
        dsa: DsaConfig,
        *,
        rope_dim: int = 0,
        has_pool_gate: bool = True,
    ) -> None:
        super().__init__()
        heads, dim = dsa.index_n_heads, dsa.index_head_dim
        self.num_heads, self.head_dim = heads, dim
        self.kpool = dsa.index_kpool
        self.topk_pools = dsa.index_topk // dsa.index_kpool
        self.select_tail = dsa.index_kpool_always_select_tail
        self.rope_dim = rope_dim
        self.wq_b = nn.Linear(q_lora_rank, heads * dim, bias=False)
        self.wk = nn.Linear(hidden_size, dim, bias=False)
        self.k_norm = nn.LayerNorm(dim, eps=INDEX_KEY_NORM_EPS)
        self.weights_proj = nn.Linear(hidden_size, heads, bias=False)
        self.index_kpool_compress_ape: nn.Parameter | None = None
        self.index_kpool_compress_gate: nn.Parameter | None = None
        if has_pool_gate:
            self.index_kpool_compress_ape = nn.Parameter(torch.empty(self.kpool, dim))
            self.index_kpool_compress_gate = nn.Parameter(torch.empty(dim, hidden_size))

    def select(
        self,
        x: torch.Tensor,
        q_latent: torch.Tensor,
        positions: torch.Tensor,
        rows: list[IndexerRows],
        metadata: AttentionMetadata,
        backend: KernelBackend,
        cos_sin: torch.Tensor | None = None,
    ) -> Selections:
        """Fold the step's tokens into the indexer cache, then each query's selected positions
        (one ``(query tokens, width)`` tensor per sequence, ``-1`` = none). ``cos_sin``: the
        RoPE table, needed with ``rope_dim``."""
        keys = self.k_norm(self.wk(x))
        queries = self.wq_b(q_latent).view(-1, self.num_heads, self.head_dim)
        if self.rope_dim:
            assert cos_sin is not None
            queries, keys = self._rotate(queries, keys, positions, cos_sin, backend)
        keys, queries = widened(keys), widened(queries)
        logits = self._pool_logits(x, positions, keys)
        head_weights = widened(self.weights_proj(x)) * self.num_heads**-0.5
        starts = metadata.query_start_loc.tolist()
        selections = []
        for i, (seq_rows, seq_len) in enumerate(zip(rows, metadata.seq_lens, strict=True)):
            span = slice(starts[i], starts[i + 1])
            seq_rows.append(seq_len - metadata.query_lens[i], keys[span], logits[span], backend)
            pooled = seq_rows.pooled_keys(seq_len // self.kpool)
            scores = backend.index_scores(
                queries[span], head_weights[span], pooled, self.head_dim**-0.5
            )
            selections.append(
                backend.select_positions(
                    scores,
                    positions[span],
                    kpool=self.kpool,
                    topk_pools=self.topk_pools,
                    select_tail=self.select_tail,
                )
            )
        return selections

    def _rotate(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        backend: KernelBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        split = [self.rope_dim, self.head_dim - self.rope_dim]
        q_rope, q_pass = torch.split(queries, split, dim=-1)
        k_rope, k_pass = torch.split(keys[:, None], split, dim=-1)
        q_rope, k_rope = backend.apply_rotary(
            q_rope.contiguous(), k_rope.contiguous(), positions, cos_sin
        )
        return torch.cat([q_rope, q_pass], dim=-1), torch.cat([k_rope, k_pass], dim=-1)[:, 0]

    def _pool_logits(
        self, x: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor
    ) -> torch.Tensor:
        """The pooling softmax's logits; zeros without a gate (single-token pools)."""
        if self.index_kpool_compress_gate is None or self.index_kpool_compress_ape is None:
            return torch.zeros_like(keys)
        logits = widened(x @ self.index_kpool_compress_gate.t())
        return logits + self.index_kpool_compress_ape.to(logits.dtype)[positions % self.kpool]


def indexer_rows(
    cache: tuple[torch.Tensor, ...],
    state: tuple[torch.Tensor, ...],
    metadata: AttentionMetadata,
    kpool: int,
) -> list[IndexerRows]:
    """Each sequence's indexer rows: paged when ``cache`` is ``(latent, index_keys)``, else
    flat in ``state`` ``(index_keys, index_flags)`` at ``metadata.state_slots``."""
    if len(cache) == 2:
        if metadata.block_size % kpool:
            raise ValueError(
                f"the paged DSA indexer needs a block size that is a multiple of "
                f"index_kpool ({kpool}), got {metadata.block_size}"
            )
        return [
            IndexerRows.paged(cache[1], table, metadata.block_size, kpool)
            for table in metadata.block_tables
        ]
    if metadata.state_slots is None or len(state) != 2:
        raise ValueError("a flat DSA indexer needs its state and metadata.state_slots")
    keys, flags = state
    return [
        IndexerRows.flat(keys[slot], flags[slot], kpool) for slot in metadata.state_slots.tolist()
    ]


class DsaAttention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        mla: MlaConfig,
        dsa: DsaConfig,
        has_indexer: bool,
        rms_norm_eps: float,
        backend: KernelBackend,
    ) -> None:
        super().__init__()
        if mla.q_lora_rank is None:
            raise ValueError("glm5_next DSA layers need q_lora_rank (the indexer reads it)")
        self.num_heads = num_heads
        self.nope_dim = mla.qk_nope_head_dim
        self.scale = (mla.qk_nope_head_dim + mla.qk_rope_head_dim) ** -0.5
        self.kpool = dsa.index_kpool
        self.backend = backend
        self.q_a_proj = nn.Linear(hidden_size, mla.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(mla.q_lora_rank, rms_norm_eps, backend)
        self.q_b_proj = nn.Linear(mla.q_lora_rank, num_heads * mla.qk_nope_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, mla.kv_lora_rank, bias=False)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, rms_norm_eps, backend)
        self.kv_b_proj = LatentExpansion(
            num_heads, mla.qk_nope_head_dim, mla.v_head_dim, mla.kv_lora_rank
        )
        self.o_proj = nn.Linear(num_heads * mla.v_head_dim, hidden_size, bias=False)
        self.indexer = Indexer(hidden_size, mla.q_lora_rank, dsa) if has_indexer else None

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: tuple[torch.Tensor, ...],
        state: tuple[torch.Tensor, ...],
        metadata: AttentionMetadata,
        shared: Selections | None,
    ) -> tuple[torch.Tensor, Selections]:
        """Normed ``x (tokens, hidden)`` -> ``(tokens, hidden)`` and the selections it used.

        ``cache`` is ``(latent,)`` or ``(latent, index_keys)`` (the paged indexer), ``state``
        ``(index_keys, index_flags)`` for the flat indexer, else empty; ``shared`` the
        selections of the full layer before a shared one.
        """
        latent_cache = cache[0]
        q_latent = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(q_latent).view(-1, self.num_heads, self.nope_dim)
        latent = self.kv_a_layernorm(self.kv_a_proj_with_mqa(x))
        write_latent(latent_cache, latent, metadata.slot_mapping)
        if self.indexer is not None:
            rows = indexer_rows(cache, state, metadata, self.kpool)
            selections = self.indexer.select(x, q_latent, positions, rows, metadata, self.backend)
        elif shared is not None:
            selections = shared
        else:
            raise ValueError("a shared DSA layer must directly follow a full DSA layer")
        absorbed = self.kv_b_proj.absorb(q)
        attended = attend_selected(
            self.backend, absorbed, latent_cache, metadata, selections, self.scale
        )
        out = self.kv_b_proj.expand(attended)
        projected: torch.Tensor = self.o_proj(out.flatten(1))
        return projected, selections


def attend_selected(
    backend: KernelBackend,
    queries: torch.Tensor,
    latent_cache: torch.Tensor,
    metadata: AttentionMetadata,
    selections: Selections,
    scale: float,
) -> torch.Tensor:
    """Each sequence's absorbed ``queries`` over the latent rows its selections name
    (``sparse_latent_attention``), in the step's token order."""
    starts = metadata.query_start_loc.tolist()
    return torch.cat(
        [
            backend.sparse_latent_attention(
                queries[starts[i] : starts[i + 1]],
                latent_cache,
                metadata.block_tables[i],
                selected,
                scale,
            )
            for i, selected in enumerate(selections)
        ]
    )
