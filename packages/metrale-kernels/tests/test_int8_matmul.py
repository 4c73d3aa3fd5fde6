"""The int8 matmul against float32 on random inputs, within the error the format allows.

A weight element is off by at most half its row's scale ``sw[n] / 2``; an input element, written
as two int8 digits, by at most ``sx[m] / 508`` (``sx`` its row's one-digit scale). So an output
element ``y[m, n] = sum_k x[m, k] w[n, k]`` is off by at most
``sum_k |x[m, k]| sw[n] / 2 + |w[n, k]| sx[m] / 508 + sx[m] sw[n] / 1016``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_kernels import TorchBackend, dequantize_rows, int8_linear, quantize_per_row
from metrale_kernels.cpu_features import CpuFeatures, parse_cpu_flags
from metrale_kernels.reference.int8_matmul import error_bound, two_digit_rows

FLOAT_SLACK = 1e-4  # float32 rounding of the reference and of the rescaling


def hand_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The bound of the module docstring, written out here apart from ``error_bound``."""
    _, x_scale = quantize_per_row(x)
    _, w_scale = quantize_per_row(w)
    x_abs, w_abs = x.abs().sum(-1, keepdim=True), w.abs().sum(-1)
    k = x.shape[-1]
    return (
        x_abs * w_scale / 2 + x_scale[:, None] * w_abs / 508 + k * x_scale[:, None] * w_scale / 1016
    )


@settings(deadline=None, max_examples=25)
@given(
    tokens=st.integers(1, 40),
    in_features=st.sampled_from([8, 64, 96, 576]),
    out_features=st.sampled_from([8, 40, 960]),
    seed=st.integers(0, 2**31 - 1),
    outlier=st.floats(1.0, 50.0),
)
def test_int8_linear_is_within_the_format_bound(
    tokens: int, in_features: int, out_features: int, seed: int, outlier: float
) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, in_features, generator=generator)
    x[:, 0] *= outlier  # an outlier channel, as after a norm with one large weight
    w = torch.randn(out_features, in_features, generator=generator) * 0.05
    bias = torch.randn(out_features, generator=generator)
    q, scale = quantize_per_row(w)

    got = int8_linear(x, q, scale, bias)

    expected = x @ w.T + bias
    error = (got - expected).abs()
    assert got.dtype == torch.float32
    assert bool((error <= error_bound(x, w) + FLOAT_SLACK * expected.abs().amax()).all())


def test_error_bound_is_the_documented_bound() -> None:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(7, 96, generator=generator) * torch.logspace(-2, 1, 96)
    w = torch.randn(40, 96, generator=generator) * 0.05
    torch.testing.assert_close(error_bound(x, w), hand_bound(x, w), rtol=1e-6, atol=0)


def test_quantize_per_row_error_is_at_most_half_a_step() -> None:
    generator = torch.Generator().manual_seed(0)
    w = torch.randn(33, 70, generator=generator) * torch.logspace(-3, 2, 33)[:, None]
    q, scale = quantize_per_row(w)
    assert q.dtype == torch.int8
    assert int(q.abs().max()) <= 127
    assert bool(((dequantize_rows(q, scale) - w).abs() <= scale[:, None] / 2 * 1.0001).all())


def test_a_zero_row_stays_zero_and_the_op_takes_out_and_empty_input() -> None:
    w = torch.randn(6, 16)
    w[2] = 0
    q, scale = quantize_per_row(w)
    assert bool((q[2] == 0).all())
    assert float(scale[2]) > 0
    x = torch.randn(3, 16)
    out = torch.full((3, 6), float("nan"))
    result = TorchBackend().int8_linear(x, q, scale, out=out)
    assert result is out
    assert bool((out[:, 2] == 0).all())
    assert not bool(out.isnan().any())
    assert int8_linear(torch.randn(0, 16), q, scale).shape == (0, 6)


def test_bfloat16_activations_come_back_bfloat16() -> None:
    w = torch.randn(8, 32)
    q, scale = quantize_per_row(w)
    x = torch.randn(2, 32).to(torch.bfloat16)
    got = int8_linear(x, q, scale)
    assert got.dtype == torch.bfloat16
    expected = int8_linear(x.float(), q, scale).to(torch.bfloat16)  # only the last rounding
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("cpuinfo", "int8_dot", "bf16_dot", "int8_matmul"),
    [
        ("processor : 0\nflags : fpu avx2 avx512f avx512_vnni avx512_bf16\n", True, True, True),
        ("processor : 0\nflags : fpu avx2 fma\n", False, False, True),
        ("processor : 0\nflags : avx2 avx_vnni amx_bf16\n", True, True, True),
        ("processor : 0\nflags : fpu sse4_2 avx\n", False, False, False),
        ("", False, False, False),
    ],
)
def test_cpu_features_from_cpuinfo(
    cpuinfo: str, int8_dot: bool, bf16_dot: bool, int8_matmul: bool
) -> None:
    features = CpuFeatures(flags=parse_cpu_flags(cpuinfo), machine="x86_64")
    assert features.int8_dot is int8_dot
    assert features.int8_matmul is int8_matmul
    assert features.bf16_dot is bf16_dot
    assert features.describe()


def test_two_digits_carry_an_activation_to_a_508th_of_its_step() -> None:
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(9, 300, generator=generator)
    x[:, 7] *= 80  # one outlier channel sets every row's scale
    digits, scale = two_digit_rows(x)
    first, second = digits.float().chunk(2)
    rebuilt = scale[:, None] * (first + second / 254)
    assert bool(((rebuilt - x).abs() <= scale[:, None] / 508 * 1.01).all())  # float32 slack
    one_digit, _ = quantize_per_row(x)
    assert (
        float((rebuilt - x).abs().max()) < float((one_digit * scale[:, None] - x).abs().max()) / 50
    )
