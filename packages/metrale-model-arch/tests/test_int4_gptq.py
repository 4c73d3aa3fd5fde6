"""GPTQ's int4 rounding (:mod:`metrale_model_arch.int4_gptq`) in column order and in act-order
(``desc_act``): act-order is plain GPTQ of the columns permuted by decreasing Hessian diagonal,
put back in column order with each column's group in ``g_idx``; the loader reads it back as
that rounding; on inputs with a few loud columns it leaves a smaller output error."""

from __future__ import annotations

import pytest
import torch

from metrale_config import Int4Method, Int4Quantization
from metrale_model_arch.gptq import gptq_round
from metrale_model_arch.int4_gptq import Int4GroupRounder, gptq_int4
from metrale_model_arch.int4_quantize import pack_int4
from metrale_model_arch.loading.int4_checkpoints import read_int4_projection

ROWS, COLS, TOKENS = 64, 256, 1024
NUM_LOUD = 8
GROUP_SIZES = [(32, True), (64, False), (128, True)]


def skewed_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """``(TOKENS, COLS)`` correlated features (a few latent ones mixed, a little noise), of
    which ``NUM_LOUD`` random columns are ten times louder; and those columns."""
    generator = torch.Generator().manual_seed(0)
    latent = torch.randn(TOKENS, 16, generator=generator)
    inputs = latent @ torch.randn(16, COLS, generator=generator)
    inputs += 0.1 * torch.randn(TOKENS, COLS, generator=generator)
    loud = torch.randperm(COLS, generator=generator)[:NUM_LOUD]
    inputs[:, loud] *= 10
    return inputs, loud


def hessian(inputs: torch.Tensor) -> torch.Tensor:
    x = inputs.to(torch.float64)
    return 2 * x.t() @ x / x.shape[0]


def weight() -> torch.Tensor:
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(1)) * 0.05


@pytest.mark.parametrize(("group_size", "is_symmetric"), GROUP_SIZES)
def test_act_order_is_gptq_of_the_columns_by_decreasing_hessian_diagonal(
    group_size: int, is_symmetric: bool
) -> None:
    inputs, _ = skewed_inputs()
    h = hessian(inputs)
    order = torch.argsort(torch.diagonal(h), descending=True)
    levels = gptq_int4(
        weight(), h, group_size, method=Int4Method.GPTQ, is_symmetric=is_symmetric,
        is_act_order=True,
    )  # fmt: skip
    permuted = gptq_int4(
        weight()[:, order], h[order][:, order], group_size, method=Int4Method.GPTQ,
        is_symmetric=is_symmetric,
    )  # fmt: skip
    assert torch.equal(levels.values[:, order], permuted.values)
    assert torch.equal(levels.scales, permuted.scales)
    assert torch.equal(levels.zeros, permuted.zeros)
    expected_groups = torch.empty(COLS, dtype=torch.int64)
    expected_groups[order] = torch.arange(COLS) // group_size
    assert torch.equal(levels.group_index, expected_groups)
    assert torch.equal(levels.dequantized()[:, order], permuted.dequantized())


def test_g_idx_groups_the_loud_columns_first_and_is_no_longer_in_order() -> None:
    inputs, loud = skewed_inputs()
    levels = gptq_int4(
        weight(), hessian(inputs), 32, method=Int4Method.GPTQ, is_symmetric=True,
        is_act_order=True,
    )  # fmt: skip
    g_idx = pack_int4(levels, method=Int4Method.GPTQ)["g_idx"]
    assert g_idx.dtype == torch.int32
    assert torch.all(g_idx[loud] == 0)
    assert torch.equal(torch.bincount(g_idx), torch.full((COLS // 32,), 32))
    assert not levels.is_in_order
    assert not torch.equal(g_idx, (torch.arange(COLS) // 32).to(torch.int32))


@pytest.mark.parametrize(("group_size", "is_symmetric"), GROUP_SIZES)
def test_the_loader_reads_act_order_back_as_its_rounding(
    group_size: int, is_symmetric: bool
) -> None:
    inputs, _ = skewed_inputs()
    levels = gptq_int4(
        weight(), hessian(inputs), group_size, method=Int4Method.GPTQ,
        is_symmetric=is_symmetric, is_act_order=True,
    )  # fmt: skip
    int4 = Int4Quantization(
        method=Int4Method.GPTQ, group_size=group_size, is_symmetric=is_symmetric, desc_act=True
    )
    parts = pack_int4(levels, method=Int4Method.GPTQ)
    read = read_int4_projection("test", parts, int4).dequantize().float()
    assert torch.equal(read, levels.dequantized())


@pytest.mark.parametrize(("group_size", "is_symmetric"), GROUP_SIZES)
def test_act_order_leaves_less_output_error_with_a_few_loud_columns(
    group_size: int, is_symmetric: bool
) -> None:
    inputs, _ = skewed_inputs()
    h = hessian(inputs)
    errors = []
    for is_act_order in (False, True):
        levels = gptq_int4(
            weight(), h, group_size, method=Int4Method.GPTQ, is_symmetric=is_symmetric,
            is_act_order=is_act_order,
        )  # fmt: skip
        errors.append(float((inputs @ weight().t() - inputs @ levels.dequantized().t()).norm()))
    ratio = errors[1] / errors[0]
    print(f"g{group_size} sym={is_symmetric}: ||XW - XW_q|| {errors[1]:.3f} act-order, "
          f"{errors[0]:.3f} in order: ratio {ratio:.3f}")  # fmt: skip
    assert ratio < 0.8


def test_the_levels_dequantize_to_what_gptq_rounded() -> None:
    """The sequential pass puts ``dequantized()`` in the model: the weight GPTQ's error feedback
    saw, bit for bit."""
    h = hessian(skewed_inputs()[0])
    rounder = Int4GroupRounder(ROWS, COLS, 64, method=Int4Method.GPTQ, is_symmetric=False)
    rounded = gptq_round(weight(), h, rounder)
    levels = gptq_int4(weight(), h, 64, method=Int4Method.GPTQ, is_symmetric=False)
    assert torch.equal(levels.dequantized(), rounded)
    assert torch.equal(levels.values, rounder.values)


def test_act_order_is_gptqs() -> None:
    with pytest.raises(ValueError, match="act-order is GPTQ's: awq's groups are consecutive"):
        gptq_int4(
            weight(), torch.eye(COLS), 32, method=Int4Method.AWQ, is_symmetric=False,
            is_act_order=True,
        )  # fmt: skip
