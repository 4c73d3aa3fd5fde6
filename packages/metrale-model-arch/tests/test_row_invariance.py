"""A token's logits do not depend on the step that computes them: inside a prefill chunk, as a
decode row, inside a speculative verification (k + 1 rows on a cached prefix) and among 63 other
sequences give bit-identical logits, for every weight format and kernel backend that runs here.
That is what makes speculation and batching exact (greedy output never depends on the load)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from metrale_config import ModelConfig, MoeConfig
from metrale_kernels.cpu.native import load_native_ops_if_possible
from metrale_model_arch import LoadOptions
from metrale_model_arch.build import build_model
from metrale_model_arch.families.llama import LlamaForCausalLM
from metrale_model_arch.registry import architecture_for
from metrale_model_arch.weight_format import Quantization

if TYPE_CHECKING:
    from .conftest import PagedRunner

PROMPT = [5, 9, 2, 77, 31, 8, 1, 40, 13, 66, 21, 3, 90, 17, 44, 28, 6, 71, 52, 11]
TARGET = 13  # the token whose logits are compared: PROMPT[TARGET] at position TARGET
DRAFTS = 3  # a verification step's k drafts after the last accepted token
OTHERS = 63
# A mixture of experts: a token's experts run with however many other tokens chose them.
MOE = {
    "model_type": "qwen3_moe",
    "qk_norm": True,
    "moe": MoeConfig(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        mlp_layer_types=("sparse", "sparse"),
    ),
}


def invariance_config(**changes: object) -> ModelConfig:
    """Shapes every format tiles (q4: rows in 16s, inputs in 32s), GQA, two layers."""
    fields: dict[str, object] = {
        "source": "row invariance",
        "model_type": "llama",
        "vocab_size": 96,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 128,
    }
    return ModelConfig(**{**fields, **changes})  # type: ignore[arg-type]


def build(
    config: ModelConfig, quantization: Quantization, backend: str, dtype: torch.dtype
) -> LlamaForCausalLM:
    torch.manual_seed(0)
    module = architecture_for(config).module
    assert module is not None
    weights = module(config).state_dict()
    for name, tensor in weights.items():
        noise = torch.randn_like(tensor, dtype=torch.float32)
        # Norm weights not all ones: a norm's weight must matter.
        weights[name] = 1 + 0.1 * noise if name.endswith("norm.weight") else 0.2 * noise
    model = build_model(
        config,
        weights.items(),
        LoadOptions(dtype=dtype, device="cpu", quantization=quantization, kernel_backend=backend),
    )
    assert isinstance(model, LlamaForCausalLM)
    return model


def other_prompt(index: int) -> list[int]:
    generator = torch.Generator().manual_seed(100 + index)
    return torch.randint(0, 96, (3 + index % 29,), generator=generator).tolist()


def logits_in_four_shapes(
    model: LlamaForCausalLM, runner_type: type[PagedRunner]
) -> dict[str, torch.Tensor]:
    def runner() -> PagedRunner:
        return runner_type(model, num_blocks=640, block_size=4, num_slots=OTHERS + 2)

    shapes: dict[str, torch.Tensor] = {}
    # Inside a prefill chunk: the whole prompt at once, the target in the middle of it.
    shapes["prefill chunk"] = runner().step({0: PROMPT})[0][TARGET]
    # A decode row: the prefix prefilled, then the target alone.
    paged = runner()
    paged.step({0: PROMPT[:TARGET]})
    shapes["decode row"] = paged.step({0: [PROMPT[TARGET]]})[0][0]
    # A speculative verification: the last accepted token and k drafts over a cached prefix.
    paged = runner()
    paged.step({0: PROMPT[: TARGET - 1]})
    verify = paged.step({0: PROMPT[TARGET - 1 : TARGET + DRAFTS]})[0]
    shapes["verification"] = verify[1]
    # Among 63 other sequences: decodes of other lengths and a prefill in the same step.
    paged = runner()
    paged.step({0: PROMPT[:TARGET]})
    for index in range(1, OTHERS):
        paged.step({index: other_prompt(index)})
    crowd: dict[int, list[int]] = {index: [7 + index % 50] for index in range(1, OTHERS)}
    crowd[0] = [PROMPT[TARGET]]
    crowd[OTHERS] = other_prompt(OTHERS)
    shapes["among 63 others"] = paged.step(crowd)[0][0]
    return shapes


def native_or_skip() -> None:
    if load_native_ops_if_possible() is None:
        pytest.skip("the native CPU ops cannot be built here (no C++ compiler)")


@pytest.mark.parametrize(
    ("quantization", "backend", "dtype"),
    [
        (Quantization.NONE, "torch", torch.float32),
        (Quantization.NONE, "cpu", torch.float32),
        (Quantization.NONE, "torch", torch.bfloat16),
        (Quantization.NONE, "cpu", torch.bfloat16),
        (Quantization.INT8, "torch", torch.float32),
        (Quantization.INT8, "cpu", torch.float32),
        (Quantization.Q4, "cpu", torch.float32),
        (Quantization.FP8, "torch", torch.float32),
        (Quantization.FP8, "torch", torch.bfloat16),
    ],
    ids=[
        "fp32-torch",
        "fp32-cpu",
        "bf16-torch",
        "bf16-cpu",
        "int8-torch",
        "int8-cpu",
        "q4-cpu",
        "fp8-torch",
        "fp8-bf16-torch",
    ],
)
@pytest.mark.parametrize(
    "changes",
    [{}, {"sliding_window": 6}, MOE, {"tie_word_embeddings": True}],
    ids=["full", "window", "moe", "tied"],
)
def test_a_tokens_logits_are_the_same_in_every_step_shape(
    paged_runner: type[PagedRunner],
    quantization: Quantization,
    backend: str,
    dtype: torch.dtype,
    changes: dict[str, object],
) -> None:
    if backend == "cpu":
        native_or_skip()
    config = invariance_config(**changes)
    if config.moe is not None and quantization != Quantization.NONE:
        pytest.skip("quantized weights are not built for MoE experts")
    model = build(config, quantization, backend, dtype)
    shapes = logits_in_four_shapes(model, paged_runner)
    reference = shapes.pop("prefill chunk")
    assert reference.abs().max() > 0
    for shape, logits in shapes.items():
        assert torch.equal(logits, reference), (
            f"{shape}: max |diff| {(logits - reference).abs().max().item():.3g}"
        )


@pytest.mark.parametrize("is_tied", [False, True], ids=["untied", "tied"])
def test_the_float32_head_multiplies_natively_each_row_as_alone(is_tied: bool) -> None:
    native_or_skip()
    model = build(
        invariance_config(tie_word_embeddings=is_tied), Quantization.NONE, "cpu", torch.float32
    )
    weight = model.lm_head.weight
    assert weight.stride() == (1, weight.shape[0])  # input-major
    hidden = torch.randn(9, 64, generator=torch.Generator().manual_seed(0))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        logits = model.compute_logits(hidden)
    assert "metrale::input_major_mm" in {event.name for event in profile.events()}
    expected = hidden.double() @ weight.double().t()
    torch.testing.assert_close(logits.double(), expected, rtol=1e-5, atol=1e-5)
    out = torch.empty_like(logits)
    assert model.compute_logits(hidden, out=out) is out
    assert torch.equal(out, logits)
    for row in range(len(hidden)):
        assert torch.equal(model.compute_logits(hidden[row : row + 1])[0], logits[row])
