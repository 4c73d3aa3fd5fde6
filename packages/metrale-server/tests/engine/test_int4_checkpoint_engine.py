"""AWQ and GPTQ int4 checkpoints served: the engine's plan equal to its allocation ledger, the
same plan from ``met memory`` on the directory, the boot log's word on the format, and greedy
generation batched equal to each prompt alone."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from metrale_testing.int4_checkpoints import save_int4_llama

from metrale_config import model_config_from_hf_file
from metrale_model_arch import Quantization, Tokenizer
from metrale_model_arch.families.int4_layers import OrderedQ4Linear
from metrale_model_arch.families.q4_layers import Q4Linear
from metrale_model_arch.memory.weights import weight_bytes
from metrale_server import LLM, EngineArgs, SamplingParams, build_engine
from metrale_server.cli.main import main
from metrale_server.devices import format_choice_lines

CASES: dict[str, dict[str, Any]] = {
    "awq": {"method": "awq", "group_size": 64},
    "gptq-desc-act": {"method": "gptq", "group_size": 32, "sym": False, "desc_act": True},
}
ARGS: dict[str, Any] = {
    "dtype": "float32",
    "device": "cpu",
    "max_seq_len": 128,
    "quantization": "q4",
    "enforce_eager": True,
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoints(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> dict[str, Path]:
    saved = {}
    for case, kwargs in CASES.items():
        path = tmp_path_factory.mktemp(case)
        save_int4_llama(
            path,
            vocab_size=default_tokenizer.vocab_size,
            bos_token_id=default_tokenizer.bos_token_id,
            eos_token_id=default_tokenizer.eos_token_id,
            **kwargs,
        )
        default_tokenizer.save(path)
        saved[case] = path
    return saved


@pytest.mark.parametrize("case", list(CASES))
def test_the_ledger_is_the_plan_and_met_memory_plans_it_from_the_config(
    checkpoints: dict[str, Path], case: str
) -> None:
    path = checkpoints[case]
    engine = build_engine(
        EngineArgs(model=str(path), max_batch_size=2, max_batch_tokens=128, **ARGS)
    )
    assert engine.loaded.quantization == Quantization.Q4
    layer = engine.loaded.model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, Q4Linear)
    assert isinstance(layer.mlp.down_proj, OrderedQ4Linear) == (case == "gptq-desc-act")
    assert engine.ledger.live_bytes_by_owner() == engine.plan.allocated_by_owner()
    expected = weight_bytes(model_config_from_hf_file(path), 4, Quantization.Q4).by_owner()
    planned = engine.plan.by_owner()
    assert {owner: planned[owner] for owner in expected} == expected
    flags = ["--max-seq-len", "128", "--max-batch-size", "2", "--dtype", "float32"]
    flags += ["--device", "cpu", "--quantization", "q4", "--json"]
    result = CliRunner().invoke(main, ["memory", str(path), *flags], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    from_config = json.loads(result.output)["by_owner"]
    assert {owner: from_config[owner] for owner in expected} == expected
    (line,) = format_choice_lines(engine.loaded, quantization_flag="auto")[:1]
    assert f"{CASES[case]['method']} int4" in line


def test_greedy_generation_batched_equals_each_prompt_alone(checkpoints: dict[str, Path]) -> None:
    """GPTQ with desc_act: the layers gather their inputs, so the engine runs them eagerly."""
    rng = random.Random(0)
    prompts = [
        {"prompt_token_ids": [rng.randrange(100, 49152) for _ in range(rng.randint(8, 30))]}
        for _ in range(4)
    ]
    llm = LLM(str(checkpoints["gptq-desc-act"]), **ARGS)
    alone = [llm.generate([prompt], GREEDY)[0].outputs[0].token_ids for prompt in prompts]
    batched = [output.outputs[0].token_ids for output in llm.generate(prompts, GREEDY)]
    assert batched == alone
    assert all(len(tokens) == GREEDY.max_tokens for tokens in alone)
    assert len({token for tokens in alone for token in tokens}) >= 8
