"""MTP speculative decoding through the engine on a tiny random glm4_moe with one MTP layer:
greedy outputs identical to plain decoding (batched, with prefix-cache hits, under
preemption), every draft block returned, seeded sampling reproducible and of the plain
distribution, the MTP layer's K/V planned and charged to the draft pool byte for byte, and
models without MTP layers refused naming the flag."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

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


def test_seeded_sampling_is_reproducible(tiny_glm4_moe_dir: Path) -> None:
    """The same seeds give the same tokens again (the distribution: with drafts kept and
    rejected, ``tests/speculative/test_mtp_sampled_distribution.py``)."""
    speculative = llm(tiny_glm4_moe_dir, max_batch_size=64, speculative_config=MTP_SPEC)
    params = SamplingParams(temperature=0.8, top_k=20, max_tokens=17, ignore_eos=True, seed=7, n=2)
    batch = prompts(4, seed=5)
    first = tokens(speculative.generate(batch, params))
    assert first == tokens(speculative.generate(batch, params))
    assert all(len(t) == 17 for t in first)
    assert speculative.engine.stats.num_draft_tokens > 0


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
