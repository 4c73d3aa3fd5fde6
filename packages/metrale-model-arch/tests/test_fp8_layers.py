"""The fp8 stand-in for a projection (:mod:`metrale_model_arch.families.fp8_layers`): float
rows quantized per output channel as ``fp8_quantize`` does, an fp8 checkpoint's rows moved in
bit for bit, a fused projection filled in parts equal to one filled whole, the forward the
fp8 op of its own buffers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from metrale_kernels import TorchBackend
from metrale_kernels.reference.fp8_matmul import fp8_linear
from metrale_model_arch.allocator import plain_allocator
from metrale_model_arch.families.fp8_layers import PER_CHANNEL, Fp8Linear, swap_in_fp8
from metrale_model_arch.fp8_quantize import quantize_fp8
from metrale_model_arch.fp8_rows import Fp8Rows, fp8_rows_of


def filled(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Fp8Linear:
    rows, cols = weight.shape
    with torch.device("meta"):
        linear = nn.Linear(cols, rows, bias=bias is not None)
    layer = Fp8Linear(linear, TorchBackend())
    layer.allocate(plain_allocator, "weights.layers", torch.device("cpu"))
    layer.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
    layer.write_rows((), weight)
    return layer


def test_a_float_weight_is_quantized_per_channel_as_fp8_quantize_does() -> None:
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(0))
    layer = filled(weight)
    q, scale = quantize_fp8(weight, PER_CHANNEL)
    assert torch.equal(layer.qweight.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(layer.scale, scale.reshape(-1))
    assert torch.equal(layer.scale, weight.abs().amax(-1) / 448)


def test_rows_written_in_parts_are_the_matrix_written_whole() -> None:
    """A fused q/k/v projection gets its rows from three tensors: each row's scale is its own."""
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(1))
    whole = filled(weight)
    parts = filled(torch.zeros(48, 64))
    for rows in (slice(0, 32), slice(32, 40), slice(40, 48)):
        parts.write_rows((rows,), weight[rows])
    assert torch.equal(parts.qweight.view(torch.uint8), whole.qweight.view(torch.uint8))
    assert torch.equal(parts.scale, whole.scale)
    with pytest.raises(ValueError, match="filled by whole rows"):
        parts.write_rows((slice(0, 8), slice(0, 8)), weight[:8, :8])


def test_an_fp8_checkpoints_rows_are_moved_in_bit_for_bit() -> None:
    generator = torch.Generator().manual_seed(2)
    q = (torch.randn(32, 64, generator=generator) * 100).to(torch.float8_e4m3fn)
    per_channel = torch.rand(32, 1, generator=generator).to(torch.bfloat16)
    layer = filled(torch.zeros(32, 64))
    layer.write_rows((), fp8_rows_of(q, per_channel))
    assert torch.equal(layer.qweight.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(layer.scale, per_channel.float().reshape(-1))
    per_tensor = torch.tensor(0.25)
    layer.write_rows((slice(0, 16),), fp8_rows_of(q[:16], per_tensor))
    assert torch.equal(layer.scale[:16], torch.full((16,), 0.25))
    assert torch.equal(layer.dequantized()[:16], q[:16].float() * 0.25)


def test_the_forward_is_the_fp8_op_of_its_buffers_with_the_bias_after() -> None:
    generator = torch.Generator().manual_seed(3)
    bias = torch.randn(48, generator=generator)
    layer = filled(torch.randn(48, 64, generator=generator), bias)
    x = torch.randn(5, 64, generator=generator)
    expected = fp8_linear(x, layer.qweight, layer.scale) + bias
    assert torch.equal(layer(x), expected)


def test_only_the_named_linears_are_swapped() -> None:
    with torch.device("meta"):
        model = nn.ModuleDict({"o_proj": nn.Linear(8, 8), "lm_head": nn.Linear(8, 8)})
    swapped = swap_in_fp8(model, frozenset({"o_proj"}), TorchBackend())
    assert list(swapped) == ["o_proj.weight"]
    assert isinstance(model["o_proj"], Fp8Linear)
    assert type(model["lm_head"]) is nn.Linear


def test_fp8_rows_dequantize_each_row_by_its_scale() -> None:
    rows = Fp8Rows(q=torch.ones(3, 2).to(torch.float8_e4m3fn), scale=torch.tensor([1.0, 2, 3]))
    assert rows.shape == (3, 2)
    assert torch.equal(rows.dequantize(), torch.tensor([[1.0, 1], [2, 2], [3, 3]]))
