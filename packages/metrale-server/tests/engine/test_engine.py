"""The engine end to end: batched greedy equals alone, under preemption, chunking and caching."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from metrale_server import LLM, SamplingParams
from metrale_server.output.outputs import RequestOutput

NUM_PROMPTS = 24


def make_prompts(
    seed: int, count: int = NUM_PROMPTS, vocab: int = 49152
) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    return [
        {"prompt_token_ids": [rng.randrange(100, vocab) for _ in range(rng.randint(1, 70))]}
        for _ in range(count)
    ]


def greedy(max_tokens: int = 12, **kwargs: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kwargs)  # type: ignore[arg-type]


def token_ids(outputs: list[RequestOutput]) -> list[tuple[int, ...]]:
    return [output.outputs[0].token_ids for output in outputs]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> Path:
    return tiny_model_dir


@pytest.fixture(scope="module")
def alone_reference(tiny: Path) -> list[tuple[int, ...]]:
    llm = LLM(str(tiny), max_batch_size=1, max_batch_tokens=4096, dtype="float32")
    return [token_ids(llm.generate([p], greedy()))[0] for p in make_prompts(0)]


def test_batched_greedy_equals_alone(tiny: Path, alone_reference: list[tuple[int, ...]]) -> None:
    llm = LLM(str(tiny), max_batch_size=16, max_batch_tokens=4096, dtype="float32")
    outputs = llm.generate(make_prompts(0), greedy())
    assert token_ids(outputs) == alone_reference
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)
    assert llm.engine.block_manager.num_free_blocks == llm.engine.num_kv_blocks


def test_preemption_keeps_outputs_identical(
    tiny: Path, alone_reference: list[tuple[int, ...]]
) -> None:
    llm = LLM(
        str(tiny), max_batch_size=16, max_batch_tokens=4096, num_kv_blocks=14, dtype="float32"
    )
    outputs = llm.generate(make_prompts(0), greedy())
    assert llm.engine.scheduler.num_preemptions > 0
    assert token_ids(outputs) == alone_reference
    assert llm.engine.block_manager.num_free_blocks == 14


def test_chunked_prefill_keeps_outputs_identical(
    tiny: Path, alone_reference: list[tuple[int, ...]]
) -> None:
    llm = LLM(str(tiny), max_batch_size=16, max_batch_tokens=24, dtype="float32")
    outputs = llm.generate(make_prompts(0), greedy())
    assert llm.engine.stats.num_partial_prefill_chunks > 0
    assert token_ids(outputs) == alone_reference


def test_prefix_caching_hits_and_keeps_outputs_identical(tiny: Path) -> None:
    rng = random.Random(1)
    shared = [rng.randrange(100, 49152) for _ in range(40)]
    prompts = [
        {"prompt_token_ids": shared + [rng.randrange(100, 49152) for _ in range(k)]}
        for k in range(0, 22)
    ]
    plain = LLM(str(tiny), max_batch_size=1, dtype="float32")
    expected = token_ids(plain.generate(prompts, greedy()))
    cached = LLM(str(tiny), max_batch_size=8, enable_prefix_caching=True, dtype="float32")
    first = cached.generate(prompts[:1], greedy())
    got = token_ids(first) + token_ids(cached.generate(prompts[1:], greedy()))
    stats = cached.engine.block_manager.stats
    assert stats.num_hit_tokens >= 21 * 32
    assert got == expected
    # A full hit still recomputes the last token: the same prompt again gives the same tokens.
    assert token_ids(cached.generate(prompts[:1], greedy())) == expected[:1]


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(tiny: Path) -> None:
    llm = LLM(str(tiny), max_batch_size=16, dtype="float32")
    seeded = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=16, seed=1234, ignore_eos=True)
    target = {"prompt_token_ids": [5000, 6000, 7000, 8000]}
    alone = llm.generate([target], seeded)[0].outputs[0].token_ids
    others = make_prompts(3, count=9)
    batch = [*others[:4], target, *others[4:]]
    params = (
        [SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)] * 4
        + [seeded]
        + [SamplingParams(temperature=0.7, max_tokens=9, ignore_eos=True)] * 5
    )
    outputs = llm.generate(batch, params)
    assert outputs[4].outputs[0].token_ids == alone
    assert len(set(alone)) > 1


def test_n_greater_than_one_gives_distinct_outputs_sharing_the_prompt(tiny: Path) -> None:
    llm = LLM(str(tiny), max_batch_size=8, dtype="float32")
    prompt = {"prompt_token_ids": list(range(1000, 1040))}
    result = llm.generate(
        [prompt], SamplingParams(n=2, temperature=1.0, max_tokens=10, seed=7, ignore_eos=True)
    )
    (output,) = result
    assert [o.index for o in output.outputs] == [0, 1]
    assert all(len(o.token_ids) == 10 for o in output.outputs)
    assert output.outputs[0].token_ids != output.outputs[1].token_ids
    assert llm.engine.stats.num_forked_sequences == 1
    assert llm.engine.block_manager.num_free_blocks == llm.engine.num_kv_blocks


def test_request_that_can_never_fit_fails_and_others_are_served(tiny: Path) -> None:
    llm = LLM(str(tiny), max_batch_size=4, num_kv_blocks=8, dtype="float32")
    prompts = [{"prompt_token_ids": [1000] * 100}, {"prompt_token_ids": [1001] * 10}, "Hello there"]
    params = [greedy(max_tokens=100), greedy(max_tokens=5), greedy(max_tokens=5)]
    outputs = llm.generate(prompts, params)
    assert outputs[0].error is not None
    assert "could never fit" in outputs[0].error
    assert outputs[0].outputs == ()
    assert [len(o.outputs[0].token_ids) for o in outputs[1:]] == [5, 5]
    too_long = llm.generate([{"prompt_token_ids": [7] * 600}], greedy())[0]
    assert too_long.error is not None
    assert "max_seq_len" in too_long.error


def test_stop_strings_and_stop_tokens(tiny: Path) -> None:
    llm = LLM(str(tiny), dtype="float32")
    prompt = {"prompt_token_ids": [3000, 3001, 3002]}
    full = llm.generate([prompt], greedy(max_tokens=20))[0].outputs[0]
    stop_token = full.token_ids[5]
    by_token = llm.generate([prompt], greedy(max_tokens=20, stop_token_ids=[stop_token]))[
        0
    ].outputs[0]
    first = full.token_ids.index(stop_token)
    assert by_token.token_ids == full.token_ids[: first + 1]
    assert by_token.finish_reason == "stop"
    assert by_token.stop_reason == stop_token
    # A stop string spanning two tokens' text is found and cut, not included.
    cut = len(full.text) // 2
    stop = full.text[cut - 2 : cut + 2]
    if not stop.strip():
        pytest.skip("random text has only whitespace around the cut")
    by_string = llm.generate([prompt], greedy(max_tokens=20, stop=[stop]))[0].outputs[0]
    assert by_string.finish_reason == "stop"
    assert by_string.stop_reason == stop
    assert by_string.text == full.text[: full.text.index(stop)]


def test_logprobs_are_returned_when_asked(tiny: Path) -> None:
    llm = LLM(str(tiny), dtype="float32")
    output = llm.generate(["Hi"], greedy(max_tokens=4, logprobs=3))[0].outputs[0]
    assert output.logprobs is not None
    assert len(output.logprobs) == 4
    for entry, token_id in zip(output.logprobs, output.token_ids, strict=True):
        assert entry.token_id == token_id
        assert len(entry.top) == 3
        assert entry.top[0][0] == token_id  # greedy: the chosen token is the most likely
        assert entry.logprob == pytest.approx(entry.top[0][1])
    plain = llm.generate(["Hi"], greedy(max_tokens=4))[0].outputs[0]
    assert plain.logprobs is None


def test_dtype_of_default_engine_is_float32_on_cpu(tiny: Path) -> None:
    llm = LLM(str(tiny))
    assert llm.engine.loaded.dtype is torch.float32
