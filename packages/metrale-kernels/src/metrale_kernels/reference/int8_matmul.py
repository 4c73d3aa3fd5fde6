"""Int8 weights times activations in two int8 digits, accumulated in int32: the reference op.

Weights are quantized once, symmetrically per output channel: ``w[n, :] ≈ scale[n] * q[n, :]``
with ``q`` in ``[-127, 127]``. Activations are not rounded to one int8 step per token (vLLM's
W8A8): on a small model that costs ~6% perplexity, most of it in the projections whose inputs
have outlier channels. Instead each token ``x`` is written as two int8 digits,
``x ≈ s * (d1 + d2 / 254)`` (``d1`` the usual per-token quantization with ``s = max|x| / 127``,
``d2`` its rounding error in steps of ``s / 254``), an error of at most ``max|x| / 64516``. Both
digits go through one ``torch._int_mm`` call as ``2 * tokens`` rows (oneDNN's VNNI path on
x86): at decode sizes the matmul is bound by reading the weight, which happens once, so the
second digit is nearly free. The int8 weight stays ``(out, in)`` row-major: its transpose is
the column-major operand ``_int_mm`` streams fastest at one row.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from metrale_kernels.column_split import ColumnSplit, row_amax

# ``(digits int8 (M, K), qweight int8 (N, K)) -> int32 (M, N)``, exactly ``digits @ qweight.T``.
IntMatmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

INT8_MAX = 127
# The second digit's step: the first digit's rounding error is at most half a step, so it
# spans [-127, 127] steps of ``scale / DIGIT_BASE``.
DIGIT_BASE = 2 * INT8_MAX
# The smallest scale: a row of zeros never divides by zero (weights give it scale 1 outright).
_MIN_SCALE = torch.finfo(torch.float32).tiny
_MIN_AMAX = 2.0**-100  # an activation row's least max|x|: 127 / it stays finite (native: kMinAmax)


def quantize_per_row(
    x: torch.Tensor, *, split: ColumnSplit | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x (rows, cols)`` -> ``(q int8 (rows, cols), scale float32 (rows,))``, symmetric.

    The error of each element is at most ``scale / 2`` of its row (``max|row| / 254``). With
    ``split``, ``x`` is a rank's columns and the scale is the whole row's.
    """
    x32 = x.to(torch.float32)
    amax = row_amax(x32, split)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax)).clamp_(min=_MIN_SCALE)
    q = torch.round(x32 / scale.unsqueeze(-1)).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def two_digit_rows(
    x: torch.Tensor, amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x (rows, cols)`` -> ``(digits int8 (2 * rows, cols), scale float32 (rows,))``.

    ``x ≈ scale * (digits[:rows] + digits[rows:] / DIGIT_BASE)``, within ``scale / 508``.
    No clamping is needed: ``|steps| <= 127`` and ``|steps - round(steps)| <= 1/2``. ``amax``
    float32 ``(rows,)``: each row's ``max|x|`` when ``x`` is only a slice of it (default: ``x``'s
    own).
    """
    if amax is None:
        amax = row_amax(x)
    amax = amax.unsqueeze(-1).clamp(min=_MIN_AMAX)
    # 127 / amax rounded once, as the native ops compute it (``127 / tensor`` would round twice)
    steps = x * (torch.full_like(amax, INT8_MAX) / amax)  # float32, in steps of the first digit
    first = steps.round()
    second = (steps - first).mul_(DIGIT_BASE).round_()
    return torch.cat((first, second)).to(torch.int8), amax.squeeze(-1) / INT8_MAX


def int8_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    int_mm: IntMatmul | None = None,
    split: ColumnSplit | None = None,
) -> torch.Tensor:
    """``x (tokens, in)`` float times ``qweight (out, in)`` int8 with ``scale (out,)`` float32.

    Returns ``(tokens, out)`` in ``x``'s dtype (``out`` when given). Versus
    ``x @ dequantized.T`` the result carries the two-digit error of ``x`` (at most
    ``max|row| / 64516`` per element of a row) and nothing else. ``int_mm`` multiplies the
    digits (default ``torch._int_mm``); being exact, any kernel gives the same result. With
    ``split`` (``x`` and ``qweight`` a rank's columns, ``scale`` the whole rows'), the digits
    use each row's whole ``max|x|`` and the int32 sums are added over the ranks: every rank
    returns what one process computes from the whole matrix, bit for bit.
    """
    num_tokens = x.shape[0]
    if num_tokens == 0:
        empty = x.new_zeros((0, qweight.shape[0]))
        return empty if out is None else out.copy_(empty)
    digits, x_scale = two_digit_rows(x, row_amax(x, split))
    accumulated = torch._int_mm(digits, qweight.t()) if int_mm is None else int_mm(digits, qweight)
    if split is not None:
        split.sum_(accumulated)
    # (first + second / base) in float32: exact enough (a relative 6e-8) for any int32 sum.
    combined = accumulated[num_tokens:] * (1 / DIGIT_BASE) + accumulated[:num_tokens]
    if x.dtype != torch.float32:
        result = (combined * scale * x_scale.unsqueeze(-1)).to(x.dtype)
        if bias is not None:
            result += bias
        return result if out is None else out.copy_(result)
    result = torch.mul(combined, scale, out=out)
    result.mul_(x_scale.unsqueeze(-1))
    if bias is not None:
        result.add_(bias)
    return result


def error_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The largest ``|int8_linear(x, *quantize_per_row(weight)) - x @ weight.T|`` the format
    allows, element by element (float32 rounding aside).

    A weight element is off by at most half its row's step ``sw[n] / 2``; an input element,
    written as two digits, by at most ``sx[m] / 508`` (``sx`` its row's one-digit step). So
    ``y[m, n] = sum_k x[m, k] w[n, k]`` is off by at most
    ``sum_k |x[m, k]| sw[n] / 2 + |w[n, k]| sx[m] / 508 + sx[m] sw[n] / 1016``.
    """
    _, x_scale = quantize_per_row(x)
    _, w_scale = quantize_per_row(weight)
    x_abs, w_abs = x.abs().sum(-1, keepdim=True), weight.abs().sum(-1)
    return (
        x_abs * w_scale / 2
        + x_scale[:, None] * w_abs / (2 * DIGIT_BASE)
        + x.shape[-1] * x_scale[:, None] * w_scale / (4 * DIGIT_BASE)
    )


def dequantize_rows(qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 matrix ``scale[:, None] * qweight`` (for embeddings and references)."""
    return qweight.to(torch.float32) * scale.unsqueeze(-1)
