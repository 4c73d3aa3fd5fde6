"""A matrix whose input columns are split over ranks (a row-parallel projection), as its
quantized products see it.

A rank holds a slice of each activation row and the matching columns of the weight. For the
split product to be the single-process one, the row is quantized over the whole row (its
``max|x|`` reduced to the maximum over the ranks) and the integer partial sums are added over
the ranks before any float arithmetic. The model layer that owns the collective passes one of
these; the ops stay free of any process group.
"""

from __future__ import annotations

from typing import Protocol

import torch


class ColumnSplit(Protocol):
    """In-place reductions over the ranks that share a row-parallel product."""

    def max_(self, tensor: torch.Tensor) -> None:
        """``tensor`` becomes the element-wise maximum of every rank's."""

    def sum_(self, tensor: torch.Tensor) -> None:
        """``tensor`` becomes the element-wise sum of every rank's."""


def row_amax(x: torch.Tensor, split: ColumnSplit | None = None) -> torch.Tensor:
    """``max|x|`` of each row of ``x (rows, cols)``, float32 ``(rows,)``; over the whole row
    (every rank's columns) when ``split``."""
    amax = x.to(torch.float32).abs().amax(dim=-1)
    if split is not None:
        split.max_(amax)
    return amax
