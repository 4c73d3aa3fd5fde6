"""The cpu backend's native layer segments and fused decode layer against the reference ops:
the same logits within float32 rounding (int8 and q4 weights), for prefills, mixed steps and
decode-only steps; and the fused decode layer gives the segments' logits bit for bit (a decode row's
result does not depend on whether its step also holds prefills)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pytest
import torch

from metrale_config import ModelConfig
from metrale_kernels.cpu.native import load_native_ops_if_possible
from metrale_model_arch import LoadOptions
from metrale_model_arch.build import build_model
from metrale_model_arch.families.llama import EAGER_EXECUTOR, LlamaForCausalLM
from metrale_model_arch.families.native_steps import (
    NATIVE_EXECUTOR,
    can_run_native_steps,
    native_executor,
)
from metrale_model_arch.weight_format import Quantization

if TYPE_CHECKING:
    from .conftest import PagedRunner

STEPS = [
    {0: [5, 9, 2, 77, 31, 8, 1], 1: [3, 3, 40], 2: [11]},  # prefills
    {0: [12], 1: [99], 2: [4]},  # decode only: the fused layer
    {0: [6], 3: [8, 8, 1, 2, 60]},  # a decode beside a prefill: the segments
    {0: [7], 1: [1], 2: [2], 3: [3]},
    {1: [7]},
]


def build(
    config: ModelConfig,
    weights: dict[str, torch.Tensor],
    backend: str,
    quantization: Quantization = Quantization.INT8,
) -> LlamaForCausalLM:
    model = build_model(
        config,
        weights.items(),
        LoadOptions(
            dtype=torch.float32, device="cpu", quantization=quantization, kernel_backend=backend
        ),
    )
    assert isinstance(model, LlamaForCausalLM)
    executor = native_executor(model)
    if executor is not None:  # as the engine installs it
        model.install_executor(executor)
    return model


@pytest.fixture
def native_available() -> None:
    if load_native_ops_if_possible() is None:
        pytest.skip("the native CPU ops cannot be built here")


@pytest.mark.usefixtures("native_available")
@pytest.mark.parametrize("quantization", [Quantization.INT8, Quantization.Q4])
@pytest.mark.parametrize("changes", [{}, {"qkv_bias": True}, {"sliding_window": 4}])
def test_native_steps_give_the_reference_logits(
    tiny_config: ModelConfig,
    paged_runner: type[PagedRunner],
    changes: dict[str, object],
    quantization: Quantization,
) -> None:
    # q4 blocks need input features in multiples of 32 (the down projection's)
    config = attrs.evolve(tiny_config, intermediate_size=64, **changes)
    torch.manual_seed(0)
    weights = LlamaForCausalLM(config).state_dict()
    reference = build(config, weights, "torch", quantization)
    native = build(config, weights, "cpu", quantization)
    assert reference.executor is EAGER_EXECUTOR
    assert native.executor is NATIVE_EXECUTOR
    runs = [paged_runner(model, num_blocks=24, block_size=4) for model in (reference, native)]
    for step in STEPS:
        expected, got = (run.step(step) for run in runs)
        for seq_id in step:
            torch.testing.assert_close(got[seq_id], expected[seq_id], rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("native_available")
@pytest.mark.parametrize("quantization", [Quantization.INT8, Quantization.Q4])
def test_the_fused_decode_layer_is_the_segments_bit_for_bit(
    tiny_config: ModelConfig, paged_runner: type[PagedRunner], quantization: Quantization
) -> None:
    config = attrs.evolve(tiny_config, intermediate_size=64)
    torch.manual_seed(1)
    weights = LlamaForCausalLM(config).state_dict()
    fused = build(config, weights, "cpu", quantization)
    segments = build(config, weights, "cpu", quantization)
    assert fused.executor.decode_layer is not None
    segments.install_executor(attrs.evolve(NATIVE_EXECUTOR, decode_layer=None))
    runs = [paged_runner(model, num_blocks=24, block_size=4) for model in (fused, segments)]
    for step in STEPS:
        a, b = (run.step(step) for run in runs)
        for seq_id in step:
            assert torch.equal(a[seq_id], b[seq_id])


def test_other_models_keep_their_steps(tiny_config: ModelConfig) -> None:
    torch.manual_seed(0)
    weights = LlamaForCausalLM(tiny_config).state_dict()
    float_model = build_model(
        tiny_config, weights.items(), LoadOptions(dtype=torch.float32, device="cpu")
    )
    assert not can_run_native_steps(float_model)
    reference = build(tiny_config, weights, "torch")
    assert not can_run_native_steps(reference)
