"""``--quantization fp8`` through the engine on the tiny random Llama: the weights fp8 as
planned (plan == ledger, byte for byte), the boot log naming the format, a request's tokens
independent of the batch it runs in, and what fp8 cannot serve refused naming the flag."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from metrale_config import model_config_from_hf_file
from metrale_model_arch import Quantization
from metrale_model_arch.families.fp8_layers import Fp8Linear
from metrale_model_arch.memory.weights import weight_bytes
from metrale_server import LLM, SamplingParams
from metrale_server.devices import format_choice_lines, kernel_summary

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
NUM_PROMPTS = 8


def prompts() -> list[dict[str, list[int]]]:
    rng = random.Random(0)
    return [
        {"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(rng.randint(2, 40))]}
        for _ in range(NUM_PROMPTS)
    ]


@pytest.fixture(scope="module")
def fp8_llm(tiny_model_dir: Path) -> LLM:
    return LLM(
        str(tiny_model_dir), dtype="bfloat16", quantization="fp8", max_seq_len=128,
        max_batch_size=NUM_PROMPTS,
    )  # fmt: skip


def test_the_weights_are_fp8_as_planned_and_the_boot_log_says_so(
    fp8_llm: LLM, tiny_model_dir: Path
) -> None:
    engine = fp8_llm.engine
    assert engine.loaded.quantization == Quantization.FP8
    assert any(isinstance(module, Fp8Linear) for module in engine.loaded.model.modules())
    assert engine.ledger.live_bytes_by_owner() == engine.plan.allocated_by_owner()
    config = model_config_from_hf_file(tiny_model_dir)
    fp8 = weight_bytes(config, 2, Quantization.FP8)
    assert engine.plan.weights == fp8
    assert fp8.layers < weight_bytes(config, 2).layers * 0.55
    lines = format_choice_lines(engine.loaded, quantization_flag="fp8")
    assert lines[0] == "weights: fp8, as --quantization asked"
    assert lines[1].startswith(
        "fp8 projections: the float weights quantized per output channel at load"
    )
    assert "W8A8" in lines[1]
    assert "torch._scaled_mm" in kernel_summary(engine.loaded)


def test_a_requests_tokens_do_not_depend_on_its_batch(fp8_llm: LLM) -> None:
    together = fp8_llm.generate(prompts(), GREEDY)
    for prompt, output in zip(prompts(), together, strict=True):
        alone = fp8_llm.generate([prompt], GREEDY)[0]
        assert alone.outputs[0].token_ids == output.outputs[0].token_ids


def test_tensor_parallelism_is_refused_naming_the_flag(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="--quantization fp8 runs on one rank: not with "):
        LLM(str(tiny_model_dir), quantization="fp8", tensor_parallel_size=2, max_seq_len=128)


def test_a_q4_gguf_is_refused_naming_the_flag() -> None:
    with pytest.raises(
        ValueError, match="--quantization fp8: the GGUF's projections are Q4_1 blocks, not floats"
    ):
        LLM(None, quantization="fp8", max_seq_len=128)
