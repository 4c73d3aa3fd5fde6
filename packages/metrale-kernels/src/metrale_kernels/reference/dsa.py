"""Reference DeepSeek sparse attention (DSA) with k-pools: the lightning indexer and the
attention over the positions it selects.

The indexer scores pools of ``P`` consecutive cached tokens: each complete pool has one pooled
key (:func:`pool_index_keys`), every query scores every pool (:func:`index_scores`), and the
top pools plus the current incomplete pool are the positions the query attends to
(:func:`select_positions`). :func:`sparse_latent_attention` is MLA in latent space over them.
All of it works on ONE sequence; reductions are float32 (float64 for float64 inputs:
:func:`~metrale_kernels.compute_dtype.compute_dtype`).
"""

from __future__ import annotations

import torch

from metrale_kernels.compute_dtype import compute_dtype, widened

# Query rows are processed in blocks whose largest temporary holds about this many elements.
_BLOCK_ELEMENTS = 1 << 24


def _row_blocks(num_rows: int, elements_per_row: int) -> list[slice]:
    step = max(1, _BLOCK_ELEMENTS // max(1, elements_per_row))
    return [slice(start, min(start + step, num_rows)) for start in range(0, num_rows, step)]


def pool_index_keys(keys: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
    """Pooled indexer keys: per pool and channel, a softmax-weighted sum over the pool's tokens.

    ``keys, gate_logits (num_pools, P, dI)``; the gate logits already include the ``ape``
    term. ``weight = softmax over P of gate_logits[..., c]``, ``out[j, c] = sum_i weight_i *
    keys[j, i, c]``, all in float32. Returns ``(num_pools, dI)`` float32.
    """
    weights = widened(gate_logits).softmax(dim=1)
    return (weights * keys.to(weights.dtype)).sum(dim=1)


def index_scores(
    index_q: torch.Tensor, head_weights: torch.Tensor, pooled_keys: torch.Tensor, scale: float
) -> torch.Tensor:
    """Indexer score of every query against every pool, float32.

    ``index_q (T, nI, dI)``, ``head_weights (T, nI)``, ``pooled_keys (J, dI)``:
    ``s[t, j] = sum_h head_weights[t, h] * relu(scale * index_q[t, h] . pooled_keys[j])``
    (``scale`` is ``dI**-0.5``; the caller has already multiplied ``head_weights`` by
    ``nI**-0.5``). Returns ``(T, J)``.
    """
    num_queries, num_heads, _ = index_q.shape
    wide = compute_dtype(index_q.dtype)
    keys_t = pooled_keys.to(wide).T
    out = torch.empty(num_queries, keys_t.shape[1], dtype=wide, device=index_q.device)
    for rows in _row_blocks(num_queries, num_heads * keys_t.shape[1]):
        # (rows, nI, J)
        logits = (index_q[rows].to(wide) @ keys_t).mul_(scale).relu_()
        out[rows] = (head_weights[rows].to(wide).unsqueeze(1) @ logits).squeeze(1)
    return out


def select_positions(
    scores: torch.Tensor,
    positions: torch.Tensor,
    *,
    kpool: int,
    topk_pools: int,
    select_tail: bool,
) -> torch.Tensor:
    """Which cached positions each query attends to, within ONE sequence.

    ``scores (T, J)`` against pools ``0..J-1`` (pool ``j`` is positions ``j*P .. j*P+P-1``,
    ``P = kpool``); ``positions (T,)`` int64, each query's 0-based position. A query at ``p``
    has ``n = (p + 1) // P`` candidates, the complete pools (columns ``>= n`` are ignored
    whatever their score); it takes the top ``min(topk_pools, n)`` by score (ties: any) and
    selects all their positions, plus the tail ``n*P .. p`` when ``select_tail`` and ``P > 1``
    (with ``P == 1`` a query's own position is pool ``p``, a candidate). So when ``(p+1) % P
    == 0`` the query selects itself only if its own pool wins.

    Returns ``(T, W)`` int64, ``W = topk_pools * P + max(P - 1, 0)``, unused entries ``-1``,
    the order within a row unspecified; never a position ``> p``. Raises ``ValueError`` for
    ``kpool < 1``, ``topk_pools < 1``, or a query with more complete pools than ``J``.
    """
    if kpool < 1 or topk_pools < 1:
        raise ValueError(f"kpool and topk_pools must be at least 1, got {kpool}, {topk_pools}")
    num_queries, num_pools = scores.shape
    device = scores.device
    positions = positions.long()
    complete = (positions + 1) // kpool
    if num_queries and int(complete.max()) > num_pools:
        raise ValueError(
            f"a query at position {int(positions.max())} has {int(complete.max())} complete "
            f"pools but scores cover {num_pools}"
        )
    out = torch.full(
        (num_queries, topk_pools * kpool + max(kpool - 1, 0)), -1, dtype=torch.long, device=device
    )
    num_chosen = min(topk_pools, num_pools)
    if num_chosen:
        candidate = torch.arange(num_pools, device=device) < complete[:, None]
        ranked = widened(scores).masked_fill(~candidate, float("-inf"))
        chosen = ranked.topk(num_chosen, dim=1).indices
        # A row with fewer than num_chosen candidates also takes some ignored columns.
        tokens = chosen[..., None] * kpool + torch.arange(kpool, device=device)
        tokens.masked_fill_((chosen >= complete[:, None])[..., None], -1)
        out[:, : num_chosen * kpool] = tokens.flatten(1)
    if select_tail and kpool > 1:
        tail = complete[:, None] * kpool + torch.arange(kpool - 1, device=device)
        out[:, topk_pools * kpool :] = tail.masked_fill(tail > positions[:, None], -1)
    return out


def sparse_latent_attention(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    block_table: torch.Tensor,
    selected: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """MLA in latent space (MQA, one shared K = V = latent) over a selection, ONE sequence.

    ``q (T, H, R)`` already absorbed into latent space; ``latent_cache (num_blocks,
    block_size, R)`` the layer's paged cache; ``block_table (n_blocks,)`` int64 this
    sequence's block ids; ``selected (T, W)`` distinct positions from :func:`select_positions`
    (``-1`` = none). Position ``p`` is ``latent_cache[block_table[p // block_size], p %
    block_size]``. ``out[t, h] = sum_{s in sel(t)} softmax_s(scale * q[t, h] . c_s) c_s``,
    reduced in float32; a row with no selection gives zeros. Only the selected slots are read
    (the others may hold NaN). Returns ``(T, H, R)`` in ``q``'s dtype.
    """
    num_queries, _, rank = q.shape
    block_size = latent_cache.shape[1]
    slots = latent_cache.view(-1, rank)
    out = torch.empty_like(q)
    wide = compute_dtype(q.dtype)
    for rows in _row_blocks(num_queries, selected.shape[1] * rank):
        chosen = selected[rows]
        valid = chosen >= 0
        picked = chosen[valid]
        slot_ids = block_table[picked // block_size] * block_size + picked % block_size
        # (rows, W, R): zeros where nothing is selected.
        context = torch.zeros((*chosen.shape, rank), dtype=wide, device=latent_cache.device)
        context[valid] = slots.index_select(0, slot_ids).to(wide)
        unused = ~valid[:, None, :]
        logits = (q[rows].to(wide) @ context.mT).mul_(scale).masked_fill_(unused, float("-inf"))
        # An empty row softmaxes to NaN everywhere, all of it masked back to 0 here.
        probs = logits.softmax(dim=-1).masked_fill_(unused, 0.0)
        out[rows] = (probs @ context).to(q.dtype)
    return out
