"""The compiled layer steps (``torch.compile``, inductor) against the eager ones: the same
logits within float32 reassociation, for float32 and int8 weights, at one token and at many."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pytest
import torch

from metrale_config import ModelConfig
from metrale_model_arch import LoadOptions
from metrale_model_arch.build import build_model
from metrale_model_arch.families.compiled_steps import can_compile, compile_executor
from metrale_model_arch.families.llama import LlamaForCausalLM, layer_output, layer_qkv
from metrale_model_arch.weight_format import Quantization

if TYPE_CHECKING:
    from .conftest import PagedRunner

# torch.compile imports modules that warn of their own deprecations.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.mark.parametrize("quantization", [Quantization.NONE, Quantization.INT8])
def test_compiled_steps_give_the_eager_logits(
    tiny_config: ModelConfig, paged_runner: type[PagedRunner], quantization: Quantization
) -> None:
    config = attrs.evolve(tiny_config, qkv_bias=True)
    torch.manual_seed(0)
    weights = LlamaForCausalLM(config).state_dict()
    models = [
        build_model(
            config,
            weights.items(),
            LoadOptions(
                dtype=torch.float32, device="cpu", quantization=quantization, kernel_backend="torch"
            ),
        )
        for _ in range(2)
    ]
    eager, compiled = models
    assert isinstance(compiled, LlamaForCausalLM)
    assert can_compile(compiled)
    executor = compile_executor(compiled)
    assert executor.name == "compiled"
    assert (executor.qkv, executor.output) != (layer_qkv, layer_output)
    compiled.install_executor(executor)
    assert compiled.executor_name == "compiled"
    assert eager.executor_name == "eager"  # only the compiled model changed
    runs = [paged_runner(model, num_blocks=16, block_size=4) for model in models]
    prompts = {0: [5, 9, 2, 77, 31, 8, 1], 1: [3, 3, 40], 2: [11]}
    steps = [prompts, {0: [12], 1: [99], 2: [4]}, {1: [7]}]  # many tokens, 3 decodes, 1
    for step in steps:
        expected, got = (run.step(step) for run in runs)
        for seq_id in step:
            torch.testing.assert_close(got[seq_id], expected[seq_id], rtol=1e-4, atol=1e-4)
