"""GPTQ's rounding (:mod:`metrale_model_arch.gptq`) with the int4 and fp8 grids: on correlated
inputs it leaves a smaller output error than round to nearest, in the same on-disk layout; with
uncorrelated features (a diagonal Hessian) it is round to nearest exactly."""

from __future__ import annotations

import pytest
import torch

from metrale_config import Int4Method, Int4Quantization
from metrale_model_arch.fp8_quantize import (
    BLOCK_128,
    Fp8Layout,
    dequantized,
    gptq_fp8,
    quantize_fp8,
)
from metrale_model_arch.gptq import gptq_round, inverse_hessian_factor
from metrale_model_arch.int4_gptq import gptq_int4
from metrale_model_arch.int4_quantize import pack_int4, quantize_int4
from metrale_model_arch.loading.int4_checkpoints import read_int4_projection

ROWS, COLS, TOKENS = 64, 256, 1024
INT4 = [(Int4Method.AWQ, 32, False), (Int4Method.GPTQ, 64, True), (Int4Method.GPTQ, 32, False)]
FP8 = [BLOCK_128, Fp8Layout(method="compressed-tensors", granularity="channel")]


def correlated_inputs() -> torch.Tensor:
    """``(TOKENS, COLS)``: features mixed from a few latent ones, plus a little noise."""
    generator = torch.Generator().manual_seed(0)
    latent = torch.randn(TOKENS, 16, generator=generator)
    mixing = torch.randn(16, COLS, generator=generator)
    return latent @ mixing + 0.1 * torch.randn(TOKENS, COLS, generator=generator)


def hessian(inputs: torch.Tensor) -> torch.Tensor:
    x = inputs.to(torch.float64)
    return 2 * x.t() @ x / x.shape[0]


def weight() -> torch.Tensor:
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(1)) * 0.05


def output_error(inputs: torch.Tensor, rounded: torch.Tensor) -> float:
    return float((inputs @ weight().t() - inputs @ rounded.t()).norm())


def int4_weight(
    parts: dict[str, torch.Tensor], method: Int4Method, group_size: int, is_symmetric: bool
) -> torch.Tensor:
    """The weight as the checkpoint loader reads it back."""
    int4 = Int4Quantization(method=method, group_size=group_size, is_symmetric=is_symmetric)
    return read_int4_projection("test", parts, int4).dequantize().float()


@pytest.mark.parametrize(("method", "group_size", "is_symmetric"), INT4)
def test_int4_gptq_beats_round_to_nearest_in_the_same_layout(
    method: Int4Method, group_size: int, is_symmetric: bool
) -> None:
    inputs = correlated_inputs()
    nearest = quantize_int4(weight(), group_size, method=method, is_symmetric=is_symmetric)
    h = hessian(inputs)
    levels = gptq_int4(weight(), h, group_size, method=method, is_symmetric=is_symmetric)
    gptq = pack_int4(levels, method=method)
    assert gptq.keys() == nearest.keys()
    for part, tensor in nearest.items():
        assert (gptq[part].shape, gptq[part].dtype) == (tensor.shape, tensor.dtype), part
    nearest_error = output_error(inputs, int4_weight(nearest, method, group_size, is_symmetric))
    gptq_error = output_error(inputs, int4_weight(gptq, method, group_size, is_symmetric))
    print(f"{method} g{group_size} sym={is_symmetric}: {gptq_error:.3f} vs {nearest_error:.3f}")
    assert gptq_error < 0.8 * nearest_error


@pytest.mark.parametrize("layout", FP8, ids=lambda layout: layout.granularity)
def test_fp8_gptq_beats_round_to_nearest_with_the_same_scales(layout: Fp8Layout) -> None:
    inputs = correlated_inputs()
    nearest_q, nearest_scale = quantize_fp8(weight(), layout)
    gptq_q, gptq_scale = gptq_fp8(weight(), hessian(inputs), layout)
    assert torch.equal(gptq_scale, nearest_scale)
    assert (gptq_q.shape, gptq_q.dtype) == (nearest_q.shape, nearest_q.dtype)
    nearest_error = output_error(inputs, dequantized(nearest_q, nearest_scale, layout))
    gptq_error = output_error(inputs, dequantized(gptq_q, gptq_scale, layout))
    print(f"fp8 {layout.granularity}: {gptq_error:.4f} vs {nearest_error:.4f}")
    assert gptq_error < 0.8 * nearest_error


@pytest.mark.parametrize(("method", "group_size", "is_symmetric"), INT4)
def test_a_diagonal_hessian_is_round_to_nearest(
    method: Int4Method, group_size: int, is_symmetric: bool
) -> None:
    diagonal = torch.diag(torch.rand(COLS, generator=torch.Generator().manual_seed(2)) + 0.5)
    nearest = quantize_int4(weight(), group_size, method=method, is_symmetric=is_symmetric)
    levels = gptq_int4(weight(), diagonal, group_size, method=method, is_symmetric=is_symmetric)
    gptq = pack_int4(levels, method=method)
    assert all(torch.equal(gptq[part], nearest[part]) for part in nearest)
    q, _ = gptq_fp8(weight(), diagonal, BLOCK_128)
    nearest_q, _ = quantize_fp8(weight(), BLOCK_128)
    assert torch.equal(q.view(torch.uint8), nearest_q.view(torch.uint8))


def test_an_unseen_feature_passes_no_error_on() -> None:
    h = hessian(correlated_inputs())
    h[5, :] = 0
    h[:, 5] = 0
    upper = inverse_hessian_factor(h)
    row = upper[5].clone()
    assert row[5] > 0
    row[5] = 0
    assert torch.all(row == 0)
    assert torch.all(upper[:, 5][:5] == 0)


class _Nearest:
    """Round to multiples of 0.25: the simplest grid."""

    def round_column(self, index: int, pending: torch.Tensor) -> torch.Tensor:
        return torch.round(pending[:, 0] * 4) / 4


def test_a_later_block_receives_the_earlier_blocks_errors() -> None:
    """Block boundaries only batch the update: every block size gives the same rounding."""
    inputs = correlated_inputs()
    whole = gptq_round(weight() * 10, hessian(inputs), _Nearest(), block_columns=COLS)
    for block_columns in (1, 32, 128):
        blocked = gptq_round(
            weight() * 10, hessian(inputs), _Nearest(), block_columns=block_columns
        )
        assert torch.equal(blocked, whole), block_columns


def test_a_hessian_of_another_size_is_refused() -> None:
    with pytest.raises(ValueError, match=r"needs a \(256, 256\) Hessian"):
        gptq_round(weight(), torch.eye(COLS - 1), _Nearest())
