"""The engine on the bundled default model: batching, preemption, chunking and prefix caching
never change greedy tokens."""

from __future__ import annotations

import pytest
import torch

from metrale_model_arch import LoadedModel, LoadOptions, load_model
from metrale_server import LLM, Engine, EngineArgs, RequestOutput, SamplingParams, build_engine

pytestmark = pytest.mark.slow

LINES = [
    "The capital of France is",
    "Once upon a time",
    "def add(a, b):",
    "In 1969, the first humans",
    "The three primary colors are",
    "Water boils at a temperature of",
    "My favourite recipe for pancakes starts with",
    "Photosynthesis is the process by which plants",
    "The quick brown fox",
    "To be or not to be,",
    "A haiku about the sea:",
    "Les Misérables est un roman de",
    "import numpy as np\nx = np.arange(10)\n",
    "The largest planet in the solar system is",
    "Dear hiring manager, I am writing to apply for",
    "Rain in Spain falls mainly",
    "The Pythagorean theorem states that",
    "SELECT name FROM users WHERE",
    "Here is a list of fruits: apple, banana,",
    "The mitochondria is",
    "Breaking news: scientists have discovered",
    "In a distant galaxy, a lone starship",
]
SYSTEM = (
    "You are a helpful assistant who answers briefly and precisely. Always think about the "
    "question before you answer, and never make up facts you do not know. "
)
PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(None, LoadOptions(dtype=torch.float32, device="cpu", max_seq_len=512))


def run(
    loaded: LoadedModel, prompts: list[str], **engine_args: object
) -> tuple[Engine, list[RequestOutput]]:
    engine = build_engine(EngineArgs(**engine_args), loaded=loaded)  # type: ignore[arg-type]
    return engine, LLM.from_engine(engine).generate(prompts, PARAMS)


def tokens(outputs: list[RequestOutput]) -> list[tuple[int, ...]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def alone(loaded: LoadedModel) -> list[tuple[int, ...]]:
    engine = build_engine(EngineArgs(max_batch_size=1), loaded=loaded)
    llm = LLM.from_engine(engine)
    return [tokens(llm.generate([line], PARAMS))[0] for line in LINES]


def test_batched_equals_alone(loaded: LoadedModel, alone: list[tuple[int, ...]]) -> None:
    engine, outputs = run(loaded, LINES, max_batch_size=len(LINES))
    assert tokens(outputs) == alone
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks


def test_preemption_equals_alone(loaded: LoadedModel, alone: list[tuple[int, ...]]) -> None:
    engine, outputs = run(loaded, LINES, max_batch_size=len(LINES), num_kv_blocks=8)
    assert engine.stats.num_preemptions > 0
    assert tokens(outputs) == alone


def test_chunked_prefill_equals_alone(loaded: LoadedModel, alone: list[tuple[int, ...]]) -> None:
    engine, outputs = run(loaded, LINES, max_batch_size=len(LINES), max_batch_tokens=7)
    assert engine.stats.num_partial_prefill_chunks > 0
    assert tokens(outputs) == alone


def test_prefix_caching_equals_no_caching(loaded: LoadedModel) -> None:
    # The reference runs batched: batched equals alone (above), and one at a time took 3/4 of
    # this test's time.
    prompts = [SYSTEM + line for line in LINES]
    _, plain = run(loaded, prompts, max_batch_size=len(LINES), enable_prefix_caching=False)
    engine, cached = run(loaded, prompts, max_batch_size=4, enable_prefix_caching=True)
    assert engine.block_manager.stats.num_hit_tokens > 0
    assert tokens(cached) == tokens(plain)
