"""Reference fused MoE: every token through its ``top_k`` experts, one matmul per expert.

Expert weights are stacked: ``w_gate_up (experts, 2 * inter, hidden)`` holds each expert's gate
projection in rows ``:inter`` and its up projection in rows ``inter:`` (loaders stack HF's
``gate_proj``/``up_proj``, Mixtral's ``w1``/``w3``, in that order), ``w_down (experts, hidden,
inter)`` its down projection.
"""

from __future__ import annotations

import torch
from torch.nn import functional

from metrale_kernels.compute_dtype import compute_dtype
from metrale_kernels.row_invariant import (
    matmul_call_rows,
    matmul_row_tile,
    row_invariant_linear,
)

ACTIVATIONS = ("silu",)


def swiglu(gate_up: torch.Tensor, swiglu_limit: float | None = None) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up (..., 2 * inter)``, gate first.

    With ``swiglu_limit`` (GLM's clamped SwiGLU) the gate is clamped to ``<= limit`` and the
    up projection to ``[-limit, limit]`` before they meet.
    """
    gate, up = gate_up.chunk(2, dim=-1)
    if swiglu_limit is not None:
        gate = gate.clamp(max=swiglu_limit)
        up = up.clamp(-swiglu_limit, swiglu_limit)
    return functional.silu(gate) * up


def fused_moe(
    hidden: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    swiglu_limit: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(hidden[t])`` for ``hidden (tokens,
    hidden)``; expert ``e`` is ``w_down[e] @ swiglu(w_gate_up[e] @ x)``.

    The ``tokens * top_k`` assignments are sorted by expert and each expert with tokens runs
    two matmuls (in the input dtype) over its contiguous slice; the weighted sum accumulates in
    float32. Returns ``(tokens, hidden)`` in ``hidden``'s dtype, written to ``out`` when given.
    NOTE: the per-expert token counts are read on the host (one device sync per call).
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    num_tokens, top_k = topk_ids.shape
    num_experts = w_gate_up.shape[0]
    flat_ids = topk_ids.flatten()
    order = flat_ids.argsort(stable=True)
    # (tokens * top_k,): the token of each assignment, in expert order.
    token_ids = order // top_k
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    routed = hidden.index_select(0, token_ids)
    wide = compute_dtype(hidden.dtype)
    expert_out = torch.empty(routed.shape, dtype=wide, device=hidden.device)
    # On the CPU each expert's rows are padded to whole row tiles: a token's result does not
    # depend on how many others chose its experts (:mod:`metrale_kernels.row_invariant`).
    tile = matmul_row_tile(hidden.dtype) if hidden.device.type == "cpu" else None
    call_rows = matmul_call_rows(hidden.dtype)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = slice(start, start + count)
        gate_up = row_invariant_linear(
            routed[rows], w_gate_up[expert], None, tile, call_rows=call_rows
        )
        activated = swiglu(gate_up, swiglu_limit)
        expert_out[rows] = row_invariant_linear(
            activated, w_down[expert], None, tile, call_rows=call_rows
        )
        start += count
    expert_out *= topk_weights.flatten().index_select(0, order).to(wide)[:, None]
    summed = torch.zeros(num_tokens, hidden.shape[1], dtype=wide, device=hidden.device)
    summed.index_add_(0, token_ids, expert_out)
    if out is None:
        return summed.to(hidden.dtype)
    return out.copy_(summed)
