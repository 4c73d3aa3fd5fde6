"""FP8 e4m3 weights times activations quantized to fp8 per token (W8A8): ``torch._scaled_mm``.

Weights are float8_e4m3fn ``(out, in)`` with a float32 scale per output channel,
``w[n, :] = scale[n] * q[n, :]``. Each token's activations are quantized when the op runs
(vLLM's dynamic per-token scheme): ``s = max|x| / 448``, ``q = e4m3(x / s)``; ``torch._scaled_mm``
multiplies the two fp8 matrices with row-wise scales (``scale_a (tokens, 1)``, ``scale_b
(1, out)``, float32) into the activations' dtype, and the bias is added after. Against
``x @ w.T`` the result carries the weight's and the activations' e4m3 rounding (3 mantissa bits:
a relative 1/16 at most per element, ~2.6% RMS).

NOTE: torch's CPU kernel is not row-invariant: a lone row (and, depending on the thread count,
a call's leftover rows) runs another micro-kernel than a full tile and differs in the last bits.
On the CPU each call's rows are padded with zeros to whole tiles of a size probed on this machine
(:func:`fp8_row_tiling`), in calls of at most a probed number of rows, as
:mod:`metrale_kernels.row_invariant` does for float matmuls. It is also slow there: it converts
the whole weight to float on every call (measured 4-8 ns a weight on one core, 30-60x a bf16
matmul of the same shape): fp8 halves bf16's memory on a CPU, not its time.
"""

from __future__ import annotations

import functools

import torch

from metrale_kernels.row_invariant import (
    MAX_CALL_ROWS,
    padded_rows,
    probe_row_tiling,
    rows_match_alone,
)

FP8_DTYPE = torch.float8_e4m3fn
E4M3_MAX = 448.0
# A row of zeros gets this scale (its digits are zeros whatever the scale).
_MIN_SCALE = torch.finfo(torch.float32).tiny
# Probed: small and wide reductions (the CPU kernel converts the weight each call, so the probe
# stays small).
_PROBE_SHAPES = ((64, 96), (256, 384))
_PROBE_ROWS = (1, 2, 3, 5, 7, 9, 13, 33, 65, 129, 200, MAX_CALL_ROWS)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x (tokens, in)`` -> ``(q float8_e4m3fn (tokens, in), scale float32 (tokens, 1))``,
    ``x ≈ scale * q``, each row by its own ``max|x| / 448``."""
    x32 = x.to(torch.float32)
    scale = (x32.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp_(min=_MIN_SCALE)
    q = (x32 / scale).clamp_(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return q, scale


def fp8_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x (tokens, in)`` float times ``qweight (out, in)`` float8_e4m3fn with ``scale (out,)``
    float32, ``x`` quantized per token; ``(tokens, out)`` in ``x``'s dtype, plus ``bias``.

    Equals ``dequantize(quantize_per_token(x)) @ (scale[:, None] * qweight).T`` up to the
    rounding of a float32 accumulation and of the output dtype. On the CPU a row's result does
    not depend on the other rows of the call (see the module)."""
    num_tokens = x.shape[0]
    if num_tokens == 0:
        return x.new_zeros((0, qweight.shape[0]))
    tiling = fp8_row_tiling(x.dtype) if x.device.type == "cpu" else None
    if tiling is None:
        result = _scaled_rows(x, qweight, scale)
    elif num_tokens <= tiling[1]:
        result = _padded_call(x, qweight, scale, tiling[0])
    else:
        tile, call_rows = tiling
        result = torch.cat(
            [
                _padded_call(x[start : start + call_rows], qweight, scale, tile)
                for start in range(0, num_tokens, call_rows)
            ]
        )
    if bias is not None:
        result += bias
    return result


def _padded_call(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, tile: int
) -> torch.Tensor:
    num_rows = x.shape[0]
    if num_rows % tile == 0:
        return _scaled_rows(x, qweight, scale)
    padded = x.new_zeros((padded_rows(num_rows, tile), x.shape[1]))
    padded[:num_rows] = x
    return _scaled_rows(padded, qweight, scale)[:num_rows]


def _scaled_rows(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    q, x_scale = quantize_per_token(x)
    return torch._scaled_mm(
        q, qweight.t(), scale_a=x_scale, scale_b=scale.view(1, -1), out_dtype=x.dtype
    )


def _is_invariant(tile: int, call_rows: int, dtype: torch.dtype) -> bool:
    generator = torch.Generator().manual_seed(0)
    for cols, rows in _PROBE_SHAPES:
        weight = torch.randn(rows, cols, generator=generator)
        qweight = (weight / (weight.abs().amax(-1, keepdim=True) / E4M3_MAX)).to(FP8_DTYPE)
        scale = torch.rand(rows, generator=generator) + 0.5
        x = torch.randn(max(_PROBE_ROWS), cols, generator=generator).to(dtype)

        def linear(
            part: torch.Tensor, qweight: torch.Tensor = qweight, scale: torch.Tensor = scale
        ) -> torch.Tensor:
            return torch.cat(
                [
                    _padded_call(part[start : start + call_rows], qweight, scale, tile)
                    for start in range(0, part.shape[0], call_rows)
                ]
            )

        if not rows_match_alone(linear, x, _PROBE_ROWS):
            return False
    return True


@functools.cache
def fp8_row_tiling(dtype: torch.dtype) -> tuple[int, int] | None:
    """``(tile, call rows)`` that make this machine's CPU ``torch._scaled_mm`` into ``dtype``
    row-invariant (:func:`~metrale_kernels.row_invariant.probe_row_tiling`), or None."""
    return probe_row_tiling(lambda tile, call_rows: _is_invariant(tile, call_rows, dtype))


def scaled_mm_support_error(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why ``torch._scaled_mm`` cannot multiply fp8 rows with row-wise scales into ``dtype``
    on ``device`` (tried on a 16 x 32 x 16 product: CUDA asks for compute capability 8.9 and
    bfloat16 out), or None."""
    try:
        q = torch.ones(16, 32, device=device).to(FP8_DTYPE)
        x_scale = torch.ones(16, 1, device=device)
        w_scale = torch.ones(1, 16, device=device)
        torch._scaled_mm(q, q.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=dtype)
    except (RuntimeError, TypeError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        return f"torch._scaled_mm does not run on {device} into {dtype}: {first_line}"
    return None
