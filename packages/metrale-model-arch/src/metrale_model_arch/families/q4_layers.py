"""The q4 stand-in for a projection's ``nn.Linear`` (:mod:`metrale_model_arch.weight_format`).

It holds the kernel's layout (:mod:`metrale_kernels.reference.q4_matmul`) as two buffers, ``packed``
uint8 and ``scales`` float16, filled a panel of 16 output rows at a time while the checkpoint
streams in: a fused q/k/v projection gets its q, k and v rows from three tensors, so each part
must start and end on a panel (every block's scale depends on that block alone).
"""

from __future__ import annotations

import torch
from torch import nn

from metrale_kernels import KernelBackend, q4_shape_error, quantize_q4
from metrale_kernels.reference.q4_matmul import Q4_BLOCK, Q4_PANEL
from metrale_model_arch.allocator import TensorAllocator
from metrale_model_arch.families.linear_swap import swap_in_linears
from metrale_model_arch.q4_1_blocks import Q4_1Blocks

_BLOCK_BYTES = Q4_BLOCK * Q4_PANEL // 2


class Q4Linear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` in 4-bit blocks of 32; ``x``'s dtype out."""

    packed: torch.Tensor
    scales: torch.Tensor

    def __init__(self, linear: nn.Linear, backend: KernelBackend) -> None:
        super().__init__()
        rows, cols = linear.out_features, linear.in_features
        if (error := q4_shape_error(rows, cols)) is not None:
            raise ValueError(error)
        self.logical_shape = (rows, cols)
        self.bias = linear.bias
        self.backend = backend
        self.register_buffer(
            "packed", torch.empty(self._packed_shape, dtype=torch.uint8, device="meta")
        )
        self.register_buffer(
            "scales", torch.empty(self._scales_shape, dtype=torch.float16, device="meta")
        )

    @property
    def _packed_shape(self) -> tuple[int, int, int]:
        rows, cols = self.logical_shape
        return rows // Q4_PANEL, cols // Q4_BLOCK, _BLOCK_BYTES

    @property
    def _scales_shape(self) -> tuple[int, int, int, int]:
        rows, cols = self.logical_shape
        return rows // Q4_PANEL, cols // Q4_BLOCK, 2, Q4_PANEL

    def allocate(self, allocator: TensorAllocator, owner: str, device: torch.device) -> None:
        self.packed = allocator(owner, self._packed_shape, torch.uint8, device)
        self.scales = allocator(owner, self._scales_shape, torch.float16, device)

    def write_rows(self, index: tuple[int | slice, ...], values: torch.Tensor | Q4_1Blocks) -> None:
        """Quantize ``values`` into rows ``index`` (``()``: all) of the matrix; a GGUF's Q4_1
        blocks are moved in as they are (the same bytes quantizing their values gives)."""
        rows, cols = self.logical_shape
        if len(index) > 1 or (index and not isinstance(index[0], slice)):
            raise ValueError(f"a q4 matrix is filled by slices of whole rows, got index {index}")
        part = index[0] if index else slice(None)
        assert isinstance(part, slice)
        start, stop, step = part.indices(rows)
        if step != 1 or start % Q4_PANEL or stop % Q4_PANEL:
            raise ValueError(
                f"a q4 matrix is filled by panels of {Q4_PANEL} rows, got rows {start}:{stop}"
            )
        if isinstance(values, Q4_1Blocks):
            packed, scales = values.q4_panels()
        else:
            packed, scales = quantize_q4(values.reshape(stop - start, cols))
        panels = slice(start // Q4_PANEL, stop // Q4_PANEL)
        self.packed[panels] = packed
        self.scales[panels] = scales

    def forward(self, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.backend.q4_linear(x, self.packed, self.scales, self.bias, out=out)


def swap_in_q4(
    model: nn.Module, linear_names: frozenset[str], backend: KernelBackend
) -> dict[str, Q4Linear]:
    """Replace every ``nn.Linear`` whose attribute name is in ``linear_names`` with a
    :class:`Q4Linear` (on the meta device, before loading); the stand-ins by the checkpoint
    parameter each replaces (``<module>.weight``). Raises ``ValueError`` for a shape the
    blocks cannot tile."""
    return swap_in_linears(model, linear_names, lambda linear: Q4Linear(linear, backend))
