"""The engine on tiny random MoE models (qwen3_moe, mixtral): batching, preemption and chunked
prefill never change greedy tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from metrale_config import model_config_from_hf_file
from metrale_server import LLM, Engine, EngineArgs, RequestOutput, SamplingParams, build_engine

MODEL_TYPES = ("qwen3_moe", "mixtral")
PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def add(a, b):",
    "In 1969, the first humans walked on the moon and then",
    "The three primary colors are",
    "Water boils at a temperature of",
    "My favourite recipe for pancakes starts with flour, eggs and",
    "SELECT name FROM users WHERE",
]
PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
MAX_SEQ_LEN = 128


def generate(
    path: Path, prompts: list[str], **engine_args: object
) -> tuple[Engine, list[RequestOutput]]:
    args = EngineArgs(
        model=str(path),
        dtype="float32",
        device="cpu",
        max_seq_len=MAX_SEQ_LEN,
        **engine_args,  # type: ignore[arg-type]
    )
    engine = build_engine(args)
    return engine, LLM.from_engine(engine).generate(prompts, PARAMS)


def tokens(outputs: list[RequestOutput]) -> list[tuple[int, ...]]:
    return [tuple(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module", params=MODEL_TYPES)
def moe_model(
    request: pytest.FixtureRequest, tiny_moe_factory: Callable[[str], Path]
) -> tuple[Path, list[tuple[int, ...]]]:
    """The model's directory, and each prompt's greedy tokens generated alone."""
    path = tiny_moe_factory(request.param)
    config = model_config_from_hf_file(path)
    assert config.model_type == request.param
    assert config.moe is not None
    alone = [tokens(generate(path, [prompt], max_batch_size=1)[1])[0] for prompt in PROMPTS]
    assert len(set(alone)) == len(PROMPTS), "a degenerate model proves little"
    return path, alone


def test_batched_equals_alone(moe_model: tuple[Path, list[tuple[int, ...]]]) -> None:
    path, alone = moe_model
    engine, outputs = generate(path, PROMPTS, max_batch_size=len(PROMPTS))
    assert tokens(outputs) == alone
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks


def test_preemption_equals_alone(moe_model: tuple[Path, list[tuple[int, ...]]]) -> None:
    path, alone = moe_model
    engine, outputs = generate(path, PROMPTS, max_batch_size=len(PROMPTS), num_kv_blocks=8)
    assert engine.stats.num_preemptions > 0
    assert tokens(outputs) == alone


def test_chunked_prefill_equals_alone(moe_model: tuple[Path, list[tuple[int, ...]]]) -> None:
    path, alone = moe_model
    engine, outputs = generate(path, PROMPTS, max_batch_size=len(PROMPTS), max_batch_tokens=7)
    assert engine.stats.num_partial_prefill_chunks > 0
    assert tokens(outputs) == alone
