"""The fp8 W8A8 linear (:mod:`metrale_kernels.reference.fp8_matmul`): against its float32
reference on random inputs, within the bounds e4m3 rounding and float32 sums allow; each row's
output independent of the other rows of the call on the CPU (padded to the probed tile, and
shown to need it)."""

from __future__ import annotations

import pytest
import torch

from metrale_kernels import TorchBackend
from metrale_kernels.reference.fp8_matmul import (
    E4M3_MAX,
    FP8_DTYPE,
    _scaled_rows,
    fp8_linear,
    fp8_row_tiling,
    quantize_per_token,
    scaled_mm_support_error,
)

# e4m3 keeps 3 mantissa bits: a normal value is off by at most half a step, 2**-4 of itself;
# a subnormal one (below 2**-6 of the scale) by at most half the subnormal step, 2**-10.
RELATIVE_ROUNDING = 2.0**-4
SUBNORMAL_HALF_STEP = 2.0**-10
FLOAT32_UNIT = 2.0**-24


def quantized_weight(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=generator)
    scale = weight.abs().amax(-1) / E4M3_MAX
    return (weight / scale[:, None]).to(FP8_DTYPE), scale


def activations(rows: int, cols: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=generator)
    x[:, 3] *= 40  # an outlier channel, as real activations have
    return x.to(dtype)


def reference(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The dequantized weight times the quantized-dequantized activations, in float32."""
    q, x_scale = quantize_per_token(x)
    return (q.float() * x_scale) @ (qweight.float() * scale[:, None]).t()


def summation_bound(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Any order of float32 sums of length K: ``2 K u sum |x| |w|`` (Higham), on both sides."""
    q, x_scale = quantize_per_token(x)
    products = (q.float() * x_scale).abs() @ (qweight.float() * scale[:, None]).abs().t()
    return 2 * x.shape[1] * FLOAT32_UNIT * products


@pytest.mark.parametrize("shape", [(1, 64, 96), (7, 100, 33), (70, 576, 192)])
def test_the_linear_is_its_float32_reference(shape: tuple[int, int, int]) -> None:
    tokens, cols, rows = shape
    qweight, scale = quantized_weight(rows, cols, seed=1)
    x = activations(tokens, cols, seed=2, dtype=torch.float32)
    difference = (fp8_linear(x, qweight, scale) - reference(x, qweight, scale)).abs()
    assert (difference <= summation_bound(x, qweight, scale)).all(), difference.max()


def test_a_bfloat16_output_is_the_reference_rounded_once() -> None:
    qweight, scale = quantized_weight(96, 128, seed=3)
    x = activations(9, 128, seed=4, dtype=torch.bfloat16)
    expected = reference(x, qweight, scale)
    difference = (fp8_linear(x, qweight, scale).float() - expected).abs()
    assert fp8_linear(x, qweight, scale).dtype == torch.bfloat16
    bound = expected.abs() * 2.0**-8 + summation_bound(x, qweight, scale)
    assert (difference <= bound).all()


def test_against_the_unquantized_product_the_error_is_e4m3_rounding_alone() -> None:
    """Each weight and activation off by at most ``max(|v| / 16, s / 1024)`` of its row's scale
    ``s``; the product's error is the sum of what those allow."""
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(80, 128, generator=generator)
    x = activations(12, 128, seed=6, dtype=torch.float32)
    w_scale = weight.abs().amax(-1) / E4M3_MAX
    qweight = (weight / w_scale[:, None]).to(FP8_DTYPE)
    x_scale = x.abs().amax(-1, keepdim=True) / E4M3_MAX
    dw = torch.maximum(weight.abs() * RELATIVE_ROUNDING, w_scale[:, None] * SUBNORMAL_HALF_STEP)
    dx = torch.maximum(x.abs() * RELATIVE_ROUNDING, x_scale * SUBNORMAL_HALF_STEP)
    bound = x.abs() @ dw.t() + dx @ weight.abs().t() + dx @ dw.t()
    exact = x.double() @ weight.double().t()
    difference = (fp8_linear(x, qweight, w_scale).double() - exact).abs()
    assert (difference <= bound.double() + summation_bound(x, qweight, w_scale)).all()
    assert difference.max() > 0  # the activations were quantized too


def test_bias_is_added_after_and_empty_and_zero_rows_pass() -> None:
    qweight, scale = quantized_weight(32, 64, seed=7)
    bias = torch.randn(32)
    x = activations(5, 64, seed=8, dtype=torch.float32)
    x[2] = 0
    out = fp8_linear(x, qweight, scale, bias)
    assert torch.equal(out, fp8_linear(x, qweight, scale) + bias)
    assert torch.equal(out[2], bias)
    assert fp8_linear(x[:0], qweight, scale).shape == (0, 32)
    assert TorchBackend().fp8_linear(x, qweight, scale, bias).equal(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_output_does_not_depend_on_the_other_rows(dtype: torch.dtype) -> None:
    qweight, scale = quantized_weight(384, 256, seed=9)
    x = activations(300, 256, seed=10, dtype=dtype)
    alone = torch.cat([fp8_linear(x[i : i + 1], qweight, scale) for i in range(len(x))])
    for num_rows in (1, 2, 3, 5, 8, 13, 33, 64, 129, 256, 257, 300):
        together = fp8_linear(x[:num_rows], qweight, scale)
        assert torch.equal(together, alone[:num_rows]), num_rows
        shifted = fp8_linear(x[1 : num_rows + 1], qweight, scale)
        assert torch.equal(shifted, alone[1 : num_rows + 1]), num_rows


def test_without_the_padding_the_cpu_kernel_is_not_row_invariant() -> None:
    """What the padding is for: torch's CPU ``_scaled_mm`` runs a lone row another way."""
    assert fp8_row_tiling(torch.float32) is not None
    qweight, scale = quantized_weight(384, 256, seed=11)
    x = activations(33, 256, seed=12, dtype=torch.float32)
    alone = torch.cat([_scaled_rows(x[i : i + 1], qweight, scale) for i in range(len(x))])
    differs = [
        n for n in (2, 3, 5, 33) if not torch.equal(_scaled_rows(x[:n], qweight, scale), alone[:n])
    ]
    if not differs:
        pytest.skip("this machine's _scaled_mm is row-invariant unpadded")


def test_the_cpu_runs_fp8_into_every_serve_dtype() -> None:
    """(torch's CPU kernel refuses no output dtype: the refusals are CUDA's, compute
    capability below 8.9 or a row-wise output other than bfloat16.)"""
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        assert scaled_mm_support_error(torch.device("cpu"), dtype) is None
