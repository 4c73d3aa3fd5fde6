"""GPTQ's error-compensating rounding (Frantar et al. 2022) of one linear layer's weight.

Given ``H = 2 X^T X`` over calibration inputs ``X (tokens, in)`` of a weight ``W (out, in)``,
the columns are rounded in order; the error of each, divided by the diagonal of the upper
Cholesky factor ``U`` of ``H^-1``, is spread onto the columns not yet rounded by its row of
``U``. Columns go in blocks of :data:`BLOCK_COLUMNS`: inside a block the update is immediate,
the later columns receive the block's errors at once (the lazy batch update). ``H`` is
dampened, ``H += DAMPING mean(diag H) I``; a feature never seen (zero diagonal) has its
weights rounded as they are and passes no error on.

The grid is the :class:`ColumnRounder`'s: it sees each column as updated so far and returns
it rounded (dequantized), keeping what it stores on disk.

Act-order (GPTQ's ``desc_act``): the columns taken by decreasing Hessian diagonal
(:func:`act_order`), the most active first, so their error is pushed onto the less active
ones; the caller permutes the weight and the Hessian and puts the result back in order.
"""

from __future__ import annotations

from typing import Protocol

import torch

BLOCK_COLUMNS = 128
# GPTQ's. On SmolLM2-135M (benches/format_quality.py) 0.1 lowered the layers' error on held-out
# text (int4 g64: 358 -> 266, round to nearest 517) but raised perplexity (int4 +105% -> +149%).
DAMPING = 0.01


class ColumnRounder(Protocol):
    """Rounds a weight's columns, in order, to its grid, keeping the stored form."""

    def round_column(self, index: int, pending: torch.Tensor) -> torch.Tensor:
        """Column ``index`` rounded, dequantized ``(out,)`` float32. ``pending (out, n)``: the
        columns ``index ..`` to the end of the current block as updated so far (``pending[:,
        0]`` is the column to round); a grid set per group reads the group from it."""
        ...


def gptq_round(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    rounder: ColumnRounder,
    *,
    block_columns: int = BLOCK_COLUMNS,
) -> torch.Tensor:
    """``weight (out, in)`` rounded column by column by ``rounder``, each column's error
    compensated on the later ones through ``hessian (in, in)``; returns the rounded weight,
    dequantized, float32."""
    rows, cols = weight.shape
    if hessian.shape != (cols, cols):
        raise ValueError(f"a ({rows}, {cols}) weight needs a ({cols}, {cols}) Hessian")
    w = weight.detach().to(torch.float64).clone()
    upper = inverse_hessian_factor(hessian)
    rounded = torch.zeros(rows, cols, dtype=torch.float32)
    for start in range(0, cols, block_columns):
        end = min(start + block_columns, cols)
        block = w[:, start:end].clone()
        errors = torch.zeros_like(block)
        factor = upper[start:end, start:end]
        for i in range(end - start):
            column = rounder.round_column(start + i, block[:, i:].float()).double()
            rounded[:, start + i] = column.float()
            error = (block[:, i] - column) / factor[i, i]
            block[:, i:] -= error.unsqueeze(1) * factor[i, i:].unsqueeze(0)
            errors[:, i] = error
        w[:, end:] -= errors @ upper[start:end, end:]
    return rounded


def act_order(hessian: torch.Tensor) -> torch.Tensor:
    """The columns by decreasing diagonal of ``hessian (in, in)`` (ties in column order), int64:
    ``order[j]`` is the ``j``-th column rounded."""
    return torch.argsort(torch.diagonal(hessian), descending=True, stable=True)


def inverse_hessian_factor(hessian: torch.Tensor) -> torch.Tensor:
    """The upper Cholesky factor of the dampened ``H^-1``, float64; a zero-diagonal feature's
    row is the identity's (its weights pass no error on)."""
    h = hessian.detach().to(torch.float64).clone()
    is_dead = torch.diagonal(h) == 0
    h[is_dead, :] = 0
    h[:, is_dead] = 0
    h[is_dead, is_dead] = 1
    diagonal = torch.diagonal(h)
    diagonal += DAMPING * diagonal.mean()
    inverse = torch.cholesky_inverse(torch.linalg.cholesky(h))
    upper: torch.Tensor = torch.linalg.cholesky(inverse, upper=True)
    return upper
