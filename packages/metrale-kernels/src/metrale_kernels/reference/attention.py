"""The ``paged_attention`` op's reference: row-invariant on the CPU, GEMM-shaped elsewhere."""

from __future__ import annotations

import torch

from metrale_kernels.attention_metadata import AttentionMetadata
from metrale_kernels.reference import paged_attention as paged
from metrale_kernels.reference.row_invariant_attention import row_invariant_attention


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    *,
    out: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of ``q (tokens, heads, head_dim)`` over each sequence's cached context.

    Query token ``i`` of a sequence sits at position ``seq_len - query_len + i`` and sees
    the keys at positions ``<=`` its own (and ``> position - sliding_window`` when a window
    is set). Grouped-query heads: query head ``h`` reads kv head ``h // (heads // kv_heads)``.
    Only the slots of each sequence's own context are read: table entries past it and
    slots past ``seq_len`` may hold anything (NaN included) without changing the result.
    Returns ``(tokens, heads, head_dim)`` (``out`` when given, which must not alias ``q``);
    raises ``ValueError`` when ``heads`` is not a multiple of ``kv_heads`` or
    ``sliding_window < 1``. On the CPU a row's result depends on its own context alone
    (:mod:`~metrale_kernels.reference.row_invariant_attention`).
    ``sinks`` (gpt-oss, ``(heads,)``): one more logit per head in each row's softmax, weighing
    no value (the row's weights sum below one); the row-invariant path computes it on any
    device.
    """
    if q.device.type == "cpu" or sinks is not None:
        return row_invariant_attention(
            q, k_cache, v_cache, metadata, scale, sliding_window, out=out, sinks=sinks
        )
    return paged.paged_attention(q, k_cache, v_cache, metadata, scale, sliding_window, out=out)
