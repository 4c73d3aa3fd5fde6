"""Reference fused MoE: every token through its ``top_k`` experts, one matmul per expert.

Expert weights are stacked: ``w_gate_up (experts, 2 * inter, hidden)`` holds each expert's gate
projection in rows ``:inter`` and its up projection in rows ``inter:`` (loaders stack HF's
``gate_proj``/``up_proj``, Mixtral's ``w1``/``w3``, in that order), ``w_down (experts, hidden,
inter)`` its down projection. With ``activation="swigluoai"`` (gpt-oss) the gate and up
rows of ``w_gate_up`` interleave instead (gate at even rows, up at odd), and each expert may add
a bias after either projection (``gate_up_bias (experts, 2 * inter)``, ``down_bias (experts,
hidden)``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch.nn import functional

from metrale_kernels.compute_dtype import compute_dtype
from metrale_kernels.row_invariant import (
    matmul_call_rows,
    matmul_row_tile,
    row_invariant_linear,
)

SILU, SWIGLUOAI = "silu", "swigluoai"
ACTIVATIONS = (SILU, SWIGLUOAI)
# (rows (n, in), weight (out, in), bias (out,) or None, out (n, out) or None) -> (n, out): one
# expert's projection, each row's result independent of the others, written to out when given.
ExpertLinear = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None], torch.Tensor
]


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


def swigluoai(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's ``(up + 1) * gate * sigmoid(alpha * gate)`` for interleaved ``gate_up (...,
    2 * inter)`` (gate at even columns, up at odd), the gate clamped to ``<= limit`` and up to
    ``[-limit, limit]``."""
    gate = gate_up[..., ::2].clamp(max=limit)
    up = gate_up[..., 1::2].clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(gate * alpha)


def expert_activation(
    activation: str, swiglu_limit: float | None, swiglu_alpha: float | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """What runs between an expert's two projections; raises ``ValueError`` naming what
    ``activation`` lacks."""
    if activation == SILU:
        return functools.partial(swiglu, swiglu_limit=swiglu_limit)
    if activation != SWIGLUOAI:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if swiglu_alpha is None or swiglu_limit is None:
        raise ValueError(f"activation {SWIGLUOAI!r} needs swiglu_alpha and swiglu_limit")
    return functools.partial(swigluoai, alpha=swiglu_alpha, limit=swiglu_limit)


def fused_moe(
    hidden: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = SILU,
    swiglu_limit: float | None = None,
    swiglu_alpha: float | None = None,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    expert_linear: ExpertLinear | None = None,
) -> torch.Tensor:
    """``sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(hidden[t])`` for ``hidden (tokens,
    hidden)``; expert ``e`` is ``w_down[e] @ act(w_gate_up[e] @ x + gate_up_bias[e]) +
    down_bias[e]`` (no bias where none is given), ``act`` :func:`swiglu` (``"silu"``) or
    :func:`swigluoai` (``"swigluoai"``, which needs ``swiglu_alpha`` and ``swiglu_limit``).

    The ``tokens * top_k`` assignments are sorted by expert and each expert with tokens runs
    two matmuls (in the input dtype) over its contiguous slice; the weighted sum accumulates in
    float32. Returns ``(tokens, hidden)`` in ``hidden``'s dtype, written to ``out`` when given.
    ``expert_linear``: what multiplies instead of torch's row-invariant matmul (a backend's
    kernel). NOTE: the per-expert token counts are read on the host (one device sync per call).
    """
    activate = expert_activation(activation, swiglu_limit, swiglu_alpha)
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
    linear = expert_linear or functools.partial(
        _copied_linear, tile=tile, call_rows=matmul_call_rows(hidden.dtype)
    )
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = slice(start, start + count)
        gate_up = linear(routed[rows], w_gate_up[expert], _row(gate_up_bias, expert), None)
        linear(activate(gate_up), w_down[expert], _row(down_bias, expert), expert_out[rows])
        start += count
    expert_out *= topk_weights.flatten().index_select(0, order).to(wide)[:, None]
    summed = torch.zeros(num_tokens, hidden.shape[1], dtype=wide, device=hidden.device)
    summed.index_add_(0, token_ids, expert_out)
    if out is None:
        return summed.to(hidden.dtype)
    return out.copy_(summed)


def _copied_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    *,
    tile: int | None,
    call_rows: int,
) -> torch.Tensor:
    result = row_invariant_linear(x, weight, bias, tile, call_rows=call_rows)
    return result if out is None else out.copy_(result)


def _row(bias: torch.Tensor | None, expert: int) -> torch.Tensor | None:
    return None if bias is None else bias[expert]
