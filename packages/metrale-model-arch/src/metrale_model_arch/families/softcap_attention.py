"""Paged attention with soft-capped scores (gemma2): ``cap * tanh(q·k * scale / cap)`` before
the mask and the softmax, as transformers' eager attention computes it.

The kernel backends' ``paged_attention`` has no soft-capping (SDPA cannot take it), so this
family op gathers each sequence's keys itself, in torch ops. Like the CPU reference it is
row-invariant: each query row attends a span that is a function of the row alone
(:func:`~metrale_kernels.reference.row_invariant_attention.plan_span_groups`), in matmuls padded
to the machine's row tile, so a row's result does not depend on what else is in the step.
"""

from __future__ import annotations

import torch

from metrale_kernels import AttentionMetadata
from metrale_kernels.reference.paged_attention import group_size
from metrale_kernels.reference.row_invariant_attention import plan_span_groups
from metrale_kernels.row_invariant import matmul_row_tile, padded_rows


def context_span(
    cache: torch.Tensor, metadata: AttentionMetadata, seq: int, start: int, width: int
) -> torch.Tensor:
    """Positions ``[start, start + width)`` of sequence ``seq`` as ``(kv_heads, width, dim)``;
    rows past its context are zeros (never the cache's padding, which may hold anything)."""
    block_size = metadata.block_size
    stop = min(start + width, metadata.seq_lens[seq])
    first_block, last_block = start // block_size, (stop - 1) // block_size
    blocks = metadata.block_tables[seq, first_block : last_block + 1]
    rows = cache.index_select(0, blocks).flatten(0, 1)
    rows = rows[start - first_block * block_size : stop - first_block * block_size]
    if stop - start < width:
        rows = torch.cat((rows, rows.new_zeros((start + width - stop, *rows.shape[1:]))))
    return rows.transpose(0, 1)


def softcapped_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    softcap: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """``q (tokens, heads, dim)`` over the paged caches, scores soft-capped at ``softcap``;
    the contract of ``KernelBackend.paged_attention`` otherwise."""
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    group = group_size(num_heads, num_kv_heads)
    tile = matmul_row_tile(q.dtype) or 1
    out = torch.empty_like(q)
    plan = metadata.derived(
        ("row_invariant_spans", sliding_window), plan_span_groups, sliding_window
    )
    for span in plan:
        keys = context_span(k_cache, metadata, span.seq, span.start, span.width).to(q.dtype)
        values = context_span(v_cache, metadata, span.seq, span.start, span.width).to(q.dtype)
        num_rows = span.rows.shape[0]
        # (kv_heads, rows * group, dim): query head h reads kv head h // group.
        query = q.index_select(0, span.rows).view(num_rows, num_kv_heads, group, head_dim)
        query = query.permute(1, 0, 2, 3).reshape(num_kv_heads, num_rows * group, head_dim)
        padded = padded_rows(num_rows * group, tile)
        if padded != num_rows * group:
            query = torch.cat(
                (query, query.new_zeros((num_kv_heads, padded - query.shape[1], head_dim))), 1
            )
        scores = torch.bmm(query, keys.transpose(1, 2)).mul_(scale)
        scores = scores.div_(softcap).tanh_().mul_(softcap)
        hidden = ~span.visible.repeat_interleave(group, 0)
        scores[:, : num_rows * group].masked_fill_(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        attended = torch.bmm(probs, values)[:, : num_rows * group]
        attended = attended.view(num_kv_heads, num_rows, group, head_dim).permute(1, 0, 2, 3)
        out.index_copy_(0, span.rows, attended.reshape(num_rows, num_heads, head_dim))
    return out
