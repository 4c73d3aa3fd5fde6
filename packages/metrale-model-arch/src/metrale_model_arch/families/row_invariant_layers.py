"""Float projections padded to whole row tiles on the CPU, so a token's output does not depend
on how many rows share its step (:mod:`metrale_kernels.row_invariant`)."""

from __future__ import annotations

import torch
from torch import nn

from metrale_kernels import KernelBackend
from metrale_kernels.row_invariant import matmul_call_rows, matmul_row_tile, row_invariant_linear


class RowInvariantLinear(nn.Linear):
    """``nn.Linear`` whose calls are padded to ``row_tile`` rows, ``row_call_rows`` rows a call
    at most (set by :func:`make_float_linears_row_invariant`); with a ``backend``, its
    ``row_invariant_linear`` multiplies instead (the vocabulary head's)."""

    row_tile: int | None = None
    row_call_rows: int = 256
    backend: KernelBackend | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return super().forward(x)
        linear = row_invariant_linear if self.backend is None else self.backend.row_invariant_linear
        return linear(x, self.weight, self.bias, self.row_tile, call_rows=self.row_call_rows)


def make_float_linears_row_invariant(model: nn.Module, dtype: torch.dtype) -> int | None:
    """Turn every plain ``nn.Linear`` of a CPU model into a :class:`RowInvariantLinear` with
    this machine's tile for ``dtype``; returns the tile (None: no tile works here, left as
    they are). The head (``lm_head``) multiplies on the model's ``backend``: the CPU one runs
    an input-major float32 head natively, its one row a sequence at decode ~3x faster than a
    padded GEMM; the other projections keep the GEMM, faster for prefill's rows."""
    tile = matmul_row_tile(dtype)
    if tile is None:
        return None
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = RowInvariantLinear
            assert isinstance(module, RowInvariantLinear)
            module.row_tile = tile
            module.row_call_rows = matmul_call_rows(dtype)
    head = getattr(model, "lm_head", None)
    if isinstance(head, RowInvariantLinear):
        head.backend = getattr(model, "backend", None)
    return tile


def head_logits(head: nn.Module, hidden: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """A float head's logits, written into ``out`` when given."""
    logits: torch.Tensor
    if out is None:
        logits = head(hidden)
        return logits
    if isinstance(head, RowInvariantLinear):
        return out.copy_(head(hidden))
    assert isinstance(head, nn.Linear)
    return torch.mm(hidden, head.weight.t(), out=out)
