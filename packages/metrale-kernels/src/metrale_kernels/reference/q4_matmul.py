"""4-bit weights in blocks of 32 with a scale and a minimum (GGUF's Q4_1), times activations in
two int8 digits: the layout, the quantizer and the reference op.

A weight block of 32 consecutive input features of one output row is ``w ≈ d * q + m``, ``q``
in ``[0, 15]``, ``d`` and ``m`` float16: 5 bits a weight, as llama.cpp stores a Q4_1 GGUF. A
GGUF's Q4_1 blocks, dequantized and quantized again here, come back bit for bit: each block
holds its minimum (``q = 0``) and its maximum (``q = 15``), so ``m`` and ``d`` are found again
exactly in float16.

The layout is the native kernel's (``metrale::q4_mm``): output rows in panels of 16, so one
512-bit ``vpdpbusd`` multiplies 16 rows by 4 input features, the int32 lanes being the rows:

- ``packed`` uint8 ``(out / 16, in / 32, 256)``: block ``b`` of panel ``p``. Its 8 quads of
  input features ``4j .. 4j + 3`` are 64 values each, row-major ``[row][feature]``; byte ``i``
  of group ``g`` (``g`` in ``0 .. 3``, bytes ``64g .. 64g + 63``) holds value ``i`` of quad
  ``g`` in its low nibble and of quad ``g + 4`` in its high nibble.
- ``scales`` float16 ``(out / 16, in / 32, 2, 16)``: the panel's 16 ``d`` of block ``b``, then
  its 16 ``m``.

The product, as the kernel computes it, with ``x`` written as two int8 digits per row
(:func:`~metrale_kernels.reference.int8_matmul.two_digit_rows`, ``x ≈ s (d1 + d2 / 254)``)::

    y[t, n] = s[t] * sum_b (d[n, b] * (D1 + D2 / 254) + m[n, b] * (S1 + S2 / 254))

``D1 = sum_{k in b} d1[t, k] q[n, k]`` and ``S1 = sum_{k in b} d1[t, k]`` exact integers (``D2``,
``S2`` likewise): ``x̂ @ dequantize_q4(packed, scales).T`` in another summation order.
"""

from __future__ import annotations

import torch

from metrale_kernels.column_split import ColumnSplit, row_amax
from metrale_kernels.reference.int8_matmul import DIGIT_BASE, two_digit_rows

Q4_BLOCK = 32  # input features per (d, m) pair
Q4_PANEL = 16  # output rows the kernel's int32 lanes hold
Q4_LEVELS = 15
_QUADS = Q4_BLOCK // 4
_GROUPS = _QUADS // 2


def q4_shape_error(rows: int, cols: int) -> str | None:
    """Why a ``(rows, cols)`` matrix cannot be stored as q4 blocks, or None."""
    if rows % Q4_PANEL or cols % Q4_BLOCK:
        return (
            f"a ({rows}, {cols}) matrix: q4 weights need output rows in multiples of "
            f"{Q4_PANEL} and input features in multiples of {Q4_BLOCK}"
        )
    return None


def _check_shape(rows: int, cols: int) -> None:
    if (error := q4_shape_error(rows, cols)) is not None:
        raise ValueError(error)


def quantize_q4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight (out, in)`` -> ``(packed uint8, scales float16)`` in the kernel's layout.

    Per block: ``m = min``, ``d = (max - min) / 15`` (both rounded to float16 first),
    ``q = clamp(round((w - m) / d), 0, 15)``; a constant block gets ``d = 0``, ``q = 0``.
    """
    rows, cols = weight.shape
    _check_shape(rows, cols)
    blocks = weight.detach().to(torch.float32).reshape(rows, cols // Q4_BLOCK, Q4_BLOCK)
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
    minimum = low.to(torch.float16)
    step = ((high - low) / Q4_LEVELS).to(torch.float16)
    m32, d32 = minimum.to(torch.float32).unsqueeze(-1), step.to(torch.float32).unsqueeze(-1)
    safe = torch.where(d32 > 0, d32, torch.ones_like(d32))
    q = torch.where(d32 > 0, torch.round((blocks - m32) / safe), torch.zeros_like(blocks))
    q = q.clamp_(0, Q4_LEVELS).to(torch.uint8)
    return _pack(q, rows, cols), _panel_scales(step, minimum, rows, cols)


def pack_ggml_q4_1(
    nibbles: torch.Tensor, step: torch.Tensor, minimum: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A GGUF's Q4_1 blocks in the kernel's layout, moved byte for byte (no arithmetic): the
    ``(packed, scales)`` that :func:`quantize_q4` gives for their dequantized values.

    ``nibbles`` uint8 ``(out, in / 32, 16)``: ggml's block, byte ``j`` holding value ``j`` in its
    low nibble and value ``j + 16`` in its high one; ``step`` and ``minimum`` float16
    ``(out, in / 32)``, the blocks' ``d`` and ``m``. Byte ``4g + e`` of ggml's block of panel row
    ``r`` is byte ``64g + 4r + e`` of the kernel's (low nibble: quad ``g``, high: quad ``g + 4``).
    """
    rows, blocks, width = nibbles.shape
    _check_shape(rows, blocks * Q4_BLOCK)
    if width != Q4_BLOCK // 2 or nibbles.dtype != torch.uint8:
        raise ValueError(f"Q4_1 nibbles: uint8 (rows, blocks, 16), got {tuple(nibbles.shape)}")
    if step.shape != (rows, blocks) or minimum.shape != (rows, blocks):
        raise ValueError("Q4_1 scales: one d and one m per block")
    # (panels, panel row, blocks, group, feature) -> (panels, blocks, group, panel row, feature)
    panel_bytes = nibbles.reshape(rows // Q4_PANEL, Q4_PANEL, blocks, _GROUPS, 4)
    packed = panel_bytes.permute(0, 2, 3, 1, 4).reshape(rows // Q4_PANEL, blocks, -1)
    scales = _panel_scales(
        step.to(torch.float16), minimum.to(torch.float16), rows, blocks * Q4_BLOCK
    )
    return packed.contiguous(), scales


def _pack(q: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    # q (rows, blocks, 32) -> (panels, blocks, quads, panel row, 4 features)
    quads = q.reshape(rows // Q4_PANEL, Q4_PANEL, cols // Q4_BLOCK, _QUADS, 4).permute(
        0, 2, 3, 1, 4
    )
    quads = quads.reshape(rows // Q4_PANEL, cols // Q4_BLOCK, _QUADS, 4 * Q4_PANEL)
    low, high = quads[:, :, :_GROUPS], quads[:, :, _GROUPS:]
    packed = low | (high << 4)
    return packed.reshape(rows // Q4_PANEL, cols // Q4_BLOCK, _GROUPS * 4 * Q4_PANEL).contiguous()


def _panel_scales(step: torch.Tensor, minimum: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    # (rows, blocks) each -> (panels, blocks, 2, panel row)
    both = torch.stack((step, minimum))  # (2, rows, blocks)
    both = both.reshape(2, rows // Q4_PANEL, Q4_PANEL, cols // Q4_BLOCK)
    return both.permute(1, 3, 0, 2).contiguous()


def q4_logical_shape(packed: torch.Tensor) -> tuple[int, int]:
    panels, blocks, _ = packed.shape
    return panels * Q4_PANEL, blocks * Q4_BLOCK


def unpack_q4(packed: torch.Tensor) -> torch.Tensor:
    """The ``q`` values, uint8 ``(out, in)``."""
    rows, cols = q4_logical_shape(packed)
    groups = packed.reshape(rows // Q4_PANEL, cols // Q4_BLOCK, _GROUPS, 4 * Q4_PANEL)
    quads = torch.cat((groups & 0x0F, groups >> 4), dim=2)  # (panels, blocks, quads, 64)
    quads = quads.reshape(rows // Q4_PANEL, cols // Q4_BLOCK, _QUADS, Q4_PANEL, 4)
    return quads.permute(0, 3, 1, 2, 4).reshape(rows, cols)


def block_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d, m)``, float32 ``(out, in / 32)`` each."""
    panels, blocks = scales.shape[:2]
    rows = panels * Q4_PANEL
    per_row = scales.to(torch.float32).permute(2, 0, 3, 1).reshape(2, rows, blocks)
    return per_row[0], per_row[1]


def dequantize_q4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float32 matrix ``d * q + m`` (for references and the unquantized paths)."""
    rows, cols = q4_logical_shape(packed)
    q = unpack_q4(packed).to(torch.float32).reshape(rows, cols // Q4_BLOCK, Q4_BLOCK)
    step, minimum = block_scales(scales)
    return torch.addcmul(minimum.unsqueeze(-1), q, step.unsqueeze(-1)).reshape(rows, cols)


def q4_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    split: ColumnSplit | None = None,
) -> torch.Tensor:
    """``x (tokens, in)`` times the q4 matrix ``(out, in)``: ``x̂ @ W.T (+ bias)`` with ``x̂``
    the two-digit ``x`` (the reference op: it dequantizes the whole matrix, every call).

    Returns ``(tokens, out)`` in ``x``'s dtype (``out`` when given). With ``split`` (``x`` and
    the matrix a rank's columns), ``x̂`` is each row's whole-row two-digit form and the float
    partial products are added over the ranks, then the bias: one process's result up to the
    order of the float additions (as float weights split)."""
    rows, cols = q4_logical_shape(packed)
    if x.shape[-1] != cols:
        raise ValueError(f"q4_linear: x has {x.shape[-1]} features, the matrix {cols}")
    num_tokens = x.shape[0]
    if num_tokens == 0:
        empty = x.new_zeros((0, rows))
        return empty if out is None else out.copy_(empty)
    x32 = x.to(torch.float32)
    digits, x_scale = two_digit_rows(x32, row_amax(x32, split))
    first, second = digits[:num_tokens].to(torch.float32), digits[num_tokens:].to(torch.float32)
    x_hat = (second * (1 / DIGIT_BASE) + first) * x_scale.unsqueeze(-1)
    result = x_hat @ dequantize_q4(packed, scales).t()
    if split is not None:
        split.sum_(result)
    if bias is not None:
        result += bias.to(torch.float32)
    result = result.to(x.dtype)
    return result if out is None else out.copy_(result)
