"""Top-k with one tie rule on every backend: the higher score first, and among equal scores
the lower index, as the CUDA routing kernels' warp argmax decides.

``torch.topk`` orders ties in no documented way (on the CPU it mostly does not take the lower
index, on CUDA it differs again), so a router built on it could send a token to other experts on
another device; with low-precision router logits, ties are common.
"""

from __future__ import annotations

import torch


def top_k_lower_index_first(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, indices)`` of the ``k`` highest ``scores`` along the last dim, in descending
    order, equal scores by ascending index."""
    values, indices = torch.sort(scores, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]
