"""GPTQ's rounding (:mod:`~metrale_model_arch.gptq`) of a projection to the int4 grid of
:mod:`~metrale_model_arch.int4_quantize`: a group's scale and zero set from its columns as
updated when its first column comes.

With act-order (GPTQ's ``desc_act``) the columns are rounded by decreasing Hessian diagonal and
the groups are consecutive in that order; the levels are put back in column order and each
column's group is its ``g_idx``: ``g_idx[i] = (the place column i was rounded) // group_size``,
as AutoGPTQ and GPTQModel write it (``qweight`` rows in column order, ``scales`` and ``qzeros``
per group).
"""

from __future__ import annotations

import torch

from metrale_config import Int4Method
from metrale_model_arch.gptq import BLOCK_COLUMNS, act_order, gptq_round
from metrale_model_arch.int4_quantize import Int4Levels, check_int4_shape, group_grid


def gptq_int4(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    group_size: int,
    *,
    method: Int4Method,
    is_symmetric: bool,
    is_act_order: bool = False,
) -> Int4Levels:
    """``weight (out, in)`` GPTQ-rounded with ``hessian (in, in)`` to int4 levels in groups of
    ``group_size``; ``is_act_order``: in act-order (GPTQ only)."""
    rows, cols = weight.shape
    check_int4_shape(rows, cols, group_size)
    if is_act_order and method != Int4Method.GPTQ:
        raise ValueError(f"act-order is GPTQ's: {method}'s groups are consecutive columns")
    rounder = Int4GroupRounder(rows, cols, group_size, method=method, is_symmetric=is_symmetric)
    # NOTE: a block holds whole groups, so a group's first column sees the whole group updated.
    block_columns = group_size * max(1, BLOCK_COLUMNS // group_size)
    if not is_act_order:
        gptq_round(weight, hessian, rounder, block_columns=block_columns)
        group_index = torch.arange(cols) // group_size
        return Int4Levels(rounder.values, rounder.scales, rounder.zeros, group_index)
    order = act_order(hessian)
    permuted_hessian = hessian[order][:, order]
    gptq_round(weight[:, order], permuted_hessian, rounder, block_columns=block_columns)
    place = torch.argsort(order)  # place[i]: when column i was rounded
    return Int4Levels(rounder.values[:, place], rounder.scales, rounder.zeros, place // group_size)


class Int4GroupRounder:
    """One weight's int4 levels, scales and zeros, filled column by column (in the order the
    columns are rounded)."""

    def __init__(
        self, rows: int, cols: int, group_size: int, *, method: Int4Method, is_symmetric: bool
    ) -> None:
        self.group_size = group_size
        self.method = method
        self.is_symmetric = is_symmetric
        self.values = torch.zeros(rows, cols, dtype=torch.int64)
        self.scales = torch.zeros(rows, cols // group_size, dtype=torch.float16)
        self.zeros = torch.zeros(rows, cols // group_size, dtype=torch.int64)

    def round_column(self, index: int, pending: torch.Tensor) -> torch.Tensor:
        group = index // self.group_size
        if index % self.group_size == 0:
            scales, zeros = group_grid(
                pending[:, : self.group_size], method=self.method, is_symmetric=self.is_symmetric
            )
            self.scales[:, group], self.zeros[:, group] = scales, zeros
        scale, zero = self.scales[:, group].float(), self.zeros[:, group]
        levels = (torch.round(pending[:, 0] / scale) + zero).clamp(0, 15).to(torch.int64)
        self.values[:, index] = levels
        return (levels - zero).float() * scale
