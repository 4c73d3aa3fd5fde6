"""n-gram speculative decoding through the engine: greedy outputs identical to plain decoding
(batched, under preemption, with prefix caching), drafts kept, and every block returned."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from metrale_server import LLM, SamplingParams
from metrale_server.output.outputs import RequestOutput
from metrale_server.speculative_config import SpeculativeConfig

SPEC = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=3)


def grounded_prompts(count: int, seed: int) -> list[dict[str, list[int]]]:
    """Prompts that repeat a passage: what n-gram drafts are for (and random models loop)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        passage = [rng.randrange(100, 40000) for _ in range(rng.randint(3, 12))]
        prompts.append({"prompt_token_ids": passage * rng.randint(1, 3)})
    return prompts


def tokens(outputs: list[RequestOutput]) -> list[tuple[int, ...]]:
    return [completion.token_ids for output in outputs for completion in output.outputs]


@pytest.fixture(scope="module")
def plain(tiny_model_dir: Path) -> LLM:
    return LLM(str(tiny_model_dir), dtype="float32", max_batch_size=16)


@pytest.fixture(scope="module")
def speculative(tiny_model_dir: Path) -> LLM:
    return LLM(str(tiny_model_dir), dtype="float32", max_batch_size=16, speculative_config=SPEC)


def test_greedy_is_identical_on_50_prompts(plain: LLM, speculative: LLM) -> None:
    prompts = grounded_prompts(50, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    assert tokens(speculative.generate(prompts, params)) == tokens(plain.generate(prompts, params))
    stats = speculative.engine.stats
    # A random model seldom repeats itself: most drafts are rejected, some kept (the default
    # model's acceptance is measured in tests/test_speculative_default_model.py).
    assert stats.num_draft_tokens > 100, stats
    assert stats.num_accepted_tokens > 0, stats
    engine = speculative.engine
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks
    engine.block_manager.check_invariants([])


def test_greedy_is_identical_under_preemption(tiny_model_dir: Path) -> None:
    # int8 weights: this random model's int8 loops are ones the drafts catch (its float32
    # ones are not), and a quantized format is where row invariance matters most.
    settings = {"dtype": "float32", "quantization": "int8", "max_batch_size": 16}
    plain = LLM(str(tiny_model_dir), **settings)
    starved = LLM(str(tiny_model_dir), num_kv_blocks=12, speculative_config=SPEC, **settings)
    prompts = grounded_prompts(16, seed=1)
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    assert tokens(starved.generate(prompts, params)) == tokens(plain.generate(prompts, params))
    assert starved.engine.scheduler.num_preemptions > 0
    assert starved.engine.stats.num_accepted_tokens > 0


def test_sampled_outputs_keep_their_lengths_and_stops(speculative: LLM) -> None:
    prompts = grounded_prompts(8, seed=2)
    params = SamplingParams(temperature=0.8, top_k=20, max_tokens=33, ignore_eos=True, n=2)
    outputs = speculative.generate(prompts, params)
    assert all(len(t) == 33 for t in tokens(outputs))
    # A stop token inside kept drafts ends the output there, and nothing after it is kept.
    reference = tokens(speculative.generate(prompts[:1], SamplingParams(temperature=0.0)))[0]
    stop = reference[5]
    [output] = speculative.generate(
        prompts[:1],
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop_token_ids=[stop]),
    )
    completion = output.outputs[0]
    assert completion.token_ids[-1] == stop
    assert stop not in completion.token_ids[:-1]
    assert completion.finish_reason == "stop"
    engine = speculative.engine
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks


def test_requests_that_need_every_step_are_not_drafted(speculative: LLM) -> None:
    before = speculative.engine.stats.num_draft_tokens
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, presence_penalty=0.5)
    [output] = speculative.generate(grounded_prompts(1, seed=3), params)
    assert len(output.outputs[0].token_ids) == 12
    assert speculative.engine.stats.num_draft_tokens == before
