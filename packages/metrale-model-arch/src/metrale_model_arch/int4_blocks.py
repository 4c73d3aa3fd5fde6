"""An AWQ/GPTQ int4 matrix as read, repacked into Q4_1 blocks for a q4 model to take as they are.

The checkpoint's weight is ``w[n, k] = (q[n, k] - z[n, g]) * s[n, g]``, ``g = group[k]``: ``q``
and ``z`` integers (``z`` in ``0 .. 16``: GPTQ v1 stores ``z - 1`` in a nibble), ``s`` float16.
With every group whole blocks of 32 (the columns sorted by group first when the groups are not
in order, :mod:`~metrale_model_arch.families.int4_layers`), each block is one Q4_1 block:
``d = s`` and ``m = -z * s``, ``w = d * q + m``.

NOTE: ``m`` is rounded to float16 (the q4 kernel's scales), which ``-z * s`` does not always
fit: ``z * s`` needs up to 4 more significant bits than ``s`` has. The same weights are also
``d = -s``, ``q' = 15 - q``, ``m = (15 - z) * s``; each block takes the form whose ``m`` float16
holds more nearly. Then ``m`` is exact for ``z`` in 0, 1, 2, 4, 7, 8, 11, 13, 14, 15, 16 (``z``
or ``15 - z`` a power of two); for ``z`` in 3, 5, 6, 9, 10, 12 it rounds unless ``s``'s low
bits are zeros (measured over random float16 ``s``: rounded in 26% of blocks for ``z`` uniform
in 0..15, against 53% with ``m = -z * s`` alone). A block whose ``m`` rounds has each weight off
by at most half a float16 ulp of ``m``, ``|m| * 2**-11`` (normal range), at most ``s / 128``: a
small fraction of the step ``s``, but shared by the block's 32 weights. GPTQ's symmetric
``z = 8`` is always exact.
"""

from __future__ import annotations

import attrs
import torch

from metrale_kernels.reference.q4_matmul import Q4_BLOCK, Q4_LEVELS
from metrale_model_arch.q4_1_blocks import Q4_1_BLOCK_BYTES, Q4_1Blocks


@attrs.frozen(eq=False)
class Int4Blocks(Q4_1Blocks):
    """``raw``: the Q4_1 blocks of the matrix with its columns in ``input_order`` (``None``:
    as stored); ``values`` uint8 ``(out, in)`` the ``q``, ``zeros`` int16 and ``scales``
    float16 ``(out, groups)``, ``group_of`` int64 ``(in,)``: the checkpoint's own, in its
    column order."""

    values: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    group_of: torch.Tensor
    input_order: torch.Tensor | None

    @classmethod
    def from_levels(
        cls,
        values: torch.Tensor,
        zeros: torch.Tensor,
        scales: torch.Tensor,
        group_of: torch.Tensor,
        input_order: torch.Tensor | None,
    ) -> Int4Blocks:
        """Repack; raises ``ValueError`` when a block of 32 (columns in ``input_order``)
        spans two groups."""
        rows, cols = values.shape
        ordered = values if input_order is None else values[:, input_order]
        column_groups = group_of if input_order is None else group_of[input_order]
        by_block = column_groups.reshape(cols // Q4_BLOCK, Q4_BLOCK)
        if not bool((by_block == by_block[:, :1]).all()):
            raise ValueError(f"a block of {Q4_BLOCK} input features spans two groups")
        block_group = by_block[:, 0]
        scale = scales[:, block_group].to(torch.float64)
        zero = zeros[:, block_group].to(torch.float64)
        # (q - z) s = s q - z s = (-s)(15 - q) + (15 - z) s: the minimum nearer float16's.
        minimum, flipped_minimum = -zero * scale, (Q4_LEVELS - zero) * scale
        is_flipped = _rounding(flipped_minimum) < _rounding(minimum)
        step = torch.where(is_flipped, -scale, scale).to(torch.float16)
        minimum = torch.where(is_flipped, flipped_minimum, minimum).to(torch.float16)
        levels = ordered.reshape(rows, cols // Q4_BLOCK, Q4_BLOCK)
        levels = torch.where(is_flipped.unsqueeze(-1), Q4_LEVELS - levels, levels)
        nibbles = levels[:, :, : Q4_BLOCK // 2] | (levels[:, :, Q4_BLOCK // 2 :] << 4)
        raw = torch.cat(
            (
                step.view(torch.uint8).reshape(rows, -1, 2),
                minimum.view(torch.uint8).reshape(rows, -1, 2),
                nibbles,
            ),
            dim=-1,
        )
        return cls(
            raw.reshape(rows, cols // Q4_BLOCK * Q4_1_BLOCK_BYTES).numpy(),
            values,
            zeros,
            scales,
            group_of,
            input_order,
        )

    def dequantize(self) -> torch.Tensor:
        """The checkpoint's float32 matrix ``(q - z) * s``, exactly, in its column order."""
        zeros = self.zeros[:, self.group_of].to(torch.float32)
        return (self.values.to(torch.float32) - zeros) * self.scales[:, self.group_of].float()

    def q4_panels(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.input_order is not None:
            raise ValueError("columns sorted by group: an OrderedQ4Linear takes these blocks")
        return super().q4_panels()

    def ordered_q4_1_blocks(self) -> Q4_1Blocks:
        """The blocks, columns in ``input_order``: what :meth:`dequantize` gives, gathered."""
        return Q4_1Blocks(self.raw)

    def __getitem__(self, index: tuple[slice, ...]) -> Q4_1Blocks | torch.Tensor:
        raise ValueError("an int4 checkpoint's projections are not split across ranks")


def _rounding(values: torch.Tensor) -> torch.Tensor:
    return (values.to(torch.float16).to(torch.float64) - values).abs()
