"""The fp8 stand-in for a projection's ``nn.Linear`` (:mod:`metrale_model_arch.weight_format`).

It holds ``qweight (out, in)`` float8_e4m3fn, row-major (its transpose is the column-major
operand ``torch._scaled_mm`` takes), and ``scale (out,)`` float32 as buffers, filled a block of
output rows at a time while the checkpoint streams in: a float tensor is quantized per output
channel (:func:`~metrale_model_arch.fp8_quantize.quantize_fp8`, round to nearest, ``max|w| /
448`` a row), an fp8 checkpoint's rows (:class:`~metrale_model_arch.fp8_rows.Fp8Rows`) are
moved in as stored.
"""

from __future__ import annotations

import torch
from torch import nn

from metrale_kernels import KernelBackend
from metrale_model_arch.allocator import TensorAllocator
from metrale_model_arch.families.linear_swap import swap_in_linears
from metrale_model_arch.fp8_quantize import Fp8Layout, quantize_fp8
from metrale_model_arch.fp8_rows import Fp8Rows

FP8_DTYPE = torch.float8_e4m3fn
PER_CHANNEL = Fp8Layout(method="compressed-tensors", granularity="channel")


class Fp8Linear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` fp8 per output channel, ``x`` fp8 per token; ``x``'s
    dtype out."""

    qweight: torch.Tensor
    scale: torch.Tensor

    def __init__(self, linear: nn.Linear, backend: KernelBackend) -> None:
        super().__init__()
        rows, cols = linear.out_features, linear.in_features
        self.logical_shape = (rows, cols)
        self.bias: nn.Parameter | None = linear.bias
        self.backend = backend
        self.register_buffer("qweight", torch.empty(rows, cols, dtype=FP8_DTYPE, device="meta"))
        self.register_buffer("scale", torch.empty(rows, dtype=torch.float32, device="meta"))

    def allocate(self, allocator: TensorAllocator, owner: str, device: torch.device) -> None:
        rows, cols = self.logical_shape
        self.qweight = allocator(owner, (rows, cols), FP8_DTYPE, device)
        self.scale = allocator(owner, (rows,), torch.float32, device)

    def write_rows(self, index: tuple[int | slice, ...], values: torch.Tensor | Fp8Rows) -> None:
        """Rows ``index`` (``()``: all) of the matrix: ``values``' own fp8 rows, or float
        ``values`` quantized per row."""
        if len(index) > 1:
            raise ValueError(f"an fp8 matrix is filled by whole rows, got index {index}")
        rows = index[0] if index else slice(None)
        if isinstance(values, Fp8Rows):
            q, scale = values.q, values.scale
        else:
            q, scale = quantize_fp8(values.reshape(-1, self.logical_shape[1]), PER_CHANNEL)
        self.qweight[rows] = q.reshape(self.qweight[rows].shape)
        self.scale[rows] = scale.reshape(self.scale[rows].shape)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``scale[:, None] * qweight`` (for references)."""
        return Fp8Rows(q=self.qweight, scale=self.scale).dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backend.fp8_linear(x, self.qweight, self.scale, self.bias)


def swap_in_fp8(
    model: nn.Module, linear_names: frozenset[str], backend: KernelBackend
) -> dict[str, Fp8Linear]:
    """Replace every ``nn.Linear`` whose attribute name is in ``linear_names`` with its fp8
    stand-in (on the meta device, before loading); returns them by the checkpoint parameter
    each replaces (``<module>.weight``)."""
    return swap_in_linears(model, linear_names, lambda linear: Fp8Linear(linear, backend))
