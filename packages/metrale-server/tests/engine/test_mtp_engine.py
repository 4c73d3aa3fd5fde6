"""MTP speculative decoding through the engine on a tiny random glm4_moe with one MTP layer:
greedy outputs identical to plain decoding (batched, with prefix-cache hits, under
preemption), every draft block returned, seeded sampling reproducible and of the plain
distribution, the MTP layer's K/V planned and charged to the draft pool byte for byte, and
models without MTP layers refused naming the flag."""

from __future__ import annotations

import collections
import random
from pathlib import Path

import pytest
import torch

from metrale_model_arch.memory import DRAFT_KV_POOL, KV_POOL, MTP
from metrale_server import LLM, EngineArgs, SamplingParams, build_engine
from metrale_server.output.outputs import RequestOutput
from metrale_server.speculative_config import SpeculativeConfig

MAX_SEQ_LEN = 256
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
MTP_SPEC = SpeculativeConfig(method="mtp", num_speculative_tokens=3)


def prompts(count: int, seed: int) -> list[dict[str, list[int]]]:
    """Random prompts, every other one sharing a prefix with the one before (prefix hits)."""
    rng = random.Random(seed)
    made: list[list[int]] = []
    for index in range(count):
        prefix = made[-1][:32] if index % 2 and made else []
        made.append(prefix + [rng.randrange(100, 40000) for _ in range(rng.randint(1, 40))])
    return [{"prompt_token_ids": p} for p in made]


def tokens(outputs: list[RequestOutput]) -> list[tuple[int, ...]]:
    return [completion.token_ids for output in outputs for completion in output.outputs]


def llm(model: Path, **args: object) -> LLM:
    return LLM(
        str(model), dtype="float32", max_seq_len=MAX_SEQ_LEN, **{"max_batch_size": 8, **args}
    )


@pytest.fixture(scope="module")
def plain(tiny_glm4_moe_dir: Path) -> list[tuple[int, ...]]:
    return tokens(llm(tiny_glm4_moe_dir).generate(prompts(20, seed=0), GREEDY))


@pytest.mark.parametrize("alias", ["mtp", "glm4_moe_mtp"])
def test_greedy_is_identical_on_20_prompts(
    tiny_glm4_moe_dir: Path, plain: list[tuple[int, ...]], alias: str
) -> None:
    spec = SpeculativeConfig(method=alias, num_speculative_tokens=3)
    speculative = llm(tiny_glm4_moe_dir, speculative_config=spec)
    assert tokens(speculative.generate(prompts(20, seed=0), GREEDY)) == plain
    engine = speculative.engine
    # A random MTP layer seldom guesses right; it drafts all the same.
    assert engine.stats.num_draft_tokens > 20 * 20, engine.stats
    assert engine.stats.prefix_cache_hits > 0
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks
    proposer = engine.core.mtp_proposer
    assert proposer is not None
    assert proposer.num_free_blocks == engine.num_kv_blocks, "every draft block comes back"


def test_greedy_is_identical_under_preemption(
    tiny_glm4_moe_dir: Path, plain: list[tuple[int, ...]]
) -> None:
    starved = llm(tiny_glm4_moe_dir, num_kv_blocks=10, speculative_config=MTP_SPEC)
    assert tokens(starved.generate(prompts(20, seed=0), GREEDY)) == plain
    engine = starved.engine
    assert engine.scheduler.num_preemptions > 0
    assert engine.stats.num_draft_tokens > 0
    proposer = engine.core.mtp_proposer
    assert proposer is not None
    assert proposer.num_free_blocks == 10


def rank_patterns(model: LLM, seeds: range) -> collections.Counter[tuple[int, ...]]:
    """How often each pattern of ranks came out: whether each sampled token (top-2 sampling)
    was the target's likelier one there (its logprob, as plain decoding reports it)."""
    prompt = {"prompt_token_ids": [101, 2024, 7, 33000, 512]}
    params = [
        SamplingParams(temperature=1.0, top_k=2, max_tokens=5, ignore_eos=True, seed=s, logprobs=1)
        for s in seeds
    ]
    patterns: collections.Counter[tuple[int, ...]] = collections.Counter()
    for output in model.generate([prompt] * len(seeds), params):
        completion = output.outputs[0]
        assert completion.logprobs is not None
        patterns[
            tuple(int(entry.top[0][0] != entry.token_id) for entry in completion.logprobs)
        ] += 1
    return patterns


def test_seeded_sampling_is_reproducible_and_keeps_the_distribution(
    tiny_glm4_moe_dir: Path,
) -> None:
    plain = llm(tiny_glm4_moe_dir, max_batch_size=64)
    speculative = llm(tiny_glm4_moe_dir, max_batch_size=64, speculative_config=MTP_SPEC)
    seeds = range(400)
    params = SamplingParams(temperature=0.8, top_k=20, max_tokens=17, ignore_eos=True, seed=7, n=2)
    batch = prompts(4, seed=5)
    first = tokens(speculative.generate(batch, params))
    assert first == tokens(speculative.generate(batch, params))
    assert all(len(t) == 17 for t in first)
    without = rank_patterns(plain, seeds)
    with_drafts = rank_patterns(speculative, range(400, 800))
    both = without + with_drafts
    kept = sorted(p for p, count in both.items() if count >= 10)
    table = torch.tensor(
        [[s[p] for p in kept] + [400 - sum(s[p] for p in kept)] for s in (without, with_drafts)],
        dtype=torch.float64,
    )
    table = table[:, table.sum(0) >= 10]
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    statistic = ((table - expected) ** 2 / expected).sum()
    degrees = table.shape[1] - 1
    assert degrees >= 5, table
    p_value = float(torch.special.gammaincc(torch.tensor(degrees / 2.0), statistic / 2))
    assert p_value > 1e-6, (p_value, without.most_common(5), with_drafts.most_common(5))
    assert speculative.engine.stats.num_draft_tokens > 400


def test_the_mtp_layer_kv_is_planned_and_charged_to_the_draft_pool(
    tiny_glm4_moe_dir: Path,
) -> None:
    engine = build_engine(
        EngineArgs(
            model=str(tiny_glm4_moe_dir),
            dtype="float32",
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=3,
            speculative_config=MTP_SPEC,
        )
    )
    live = engine.ledger.live_bytes_by_owner()
    assert live == engine.plan.allocated_by_owner()
    assert MTP in live
    proposer = engine.core.mtp_proposer
    assert proposer is not None
    # One layer, K and V of two heads of 16 float32 values, one draft block per target block.
    assert live[DRAFT_KV_POOL] == engine.num_kv_blocks * 16 * (2 * 2 * 16 * 4)
    assert live[DRAFT_KV_POOL] == proposer.kv_caches.num_bytes
    assert live[KV_POOL] == 2 * live[DRAFT_KV_POOL]  # the target's two layers
    plain = build_engine(
        EngineArgs(
            model=str(tiny_glm4_moe_dir),
            dtype="float32",
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=3,
        )
    )
    assert DRAFT_KV_POOL not in plain.ledger.live_bytes_by_owner()
    assert plain.ledger.live_bytes_by_owner() == plain.plan.allocated_by_owner()


def test_a_model_without_mtp_layers_is_refused_naming_the_flag(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"--speculative-config method mtp: llama .* no MTP"):
        llm(tiny_model_dir, speculative_config=MTP_SPEC)
