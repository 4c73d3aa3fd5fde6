"""Draft-model speculative decoding through the engine: greedy outputs identical to plain
decoding (with the target as its own draft, where every draft is right, and with a different
small model, where most are wrong), under preemption; the draft's weights and KV pool planned
and charged to their own owners, byte for byte; a draft with another tokenizer refused."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import attrs
import pytest
import torch

from metrale_model_arch import Quantization, Tokenizer
from metrale_model_arch.memory import DRAFT_KV_POOL, DRAFT_MODEL
from metrale_server import LLM, EngineArgs, SamplingParams, build_engine
from metrale_server.output.outputs import RequestOutput
from metrale_server.speculative_config import SpeculativeConfig

MAX_SEQ_LEN = 256
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


def prompts(count: int, seed: int) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    return [
        {"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(rng.randint(1, 40))]}
        for _ in range(count)
    ]


def tokens(outputs: list[RequestOutput]) -> list[tuple[int, ...]]:
    return [completion.token_ids for output in outputs for completion in output.outputs]


def draft_config(path: Path, num_tokens: int = 4) -> SpeculativeConfig:
    return SpeculativeConfig(
        method="draft_model", model=str(path), num_speculative_tokens=num_tokens
    )


def llm(model: Path, **args: object) -> LLM:
    # float32 weights: int8 is slower than float32 at these tiny widths.
    return LLM(
        str(model),
        dtype="float32",
        quantization="none",
        max_seq_len=MAX_SEQ_LEN,
        max_batch_size=16,
        **args,
    )


@pytest.fixture(scope="module")
def other_draft_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    """A smaller random Llama (one layer, another seed) over the same tokenizer."""
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tiny-draft")
    config = transformers.LlamaConfig(
        vocab_size=default_tokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,  # shorter than the serve: no drafts past it
        initializer_range=0.2,
    )
    torch.manual_seed(1)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    default_tokenizer.save(path)
    return path


@pytest.fixture(scope="module")
def plain(tiny_model_dir: Path) -> list[tuple[int, ...]]:
    return tokens(llm(tiny_model_dir).generate(prompts(50, seed=0), GREEDY))


def test_the_target_as_its_own_draft_keeps_every_draft(
    tiny_model_dir: Path, plain: list[tuple[int, ...]]
) -> None:
    speculative = llm(tiny_model_dir, speculative_config=draft_config(tiny_model_dir))
    assert tokens(speculative.generate(prompts(50, seed=0), GREEDY)) == plain
    stats = speculative.engine.stats
    assert stats.num_draft_tokens > 500
    # Only near-ties between the two forwards' roundings can differ.
    assert stats.num_accepted_tokens >= 0.95 * stats.num_draft_tokens, stats
    engine = speculative.engine
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks
    proposer = engine.core.draft_proposer
    assert proposer is not None
    assert proposer.num_free_blocks == engine.num_kv_blocks, "every draft block comes back"


def test_another_draft_model_changes_nothing_but_the_speed(
    tiny_model_dir: Path, other_draft_dir: Path, plain: list[tuple[int, ...]]
) -> None:
    speculative = llm(tiny_model_dir, speculative_config=draft_config(other_draft_dir, 3))
    assert tokens(speculative.generate(prompts(50, seed=0), GREEDY)) == plain
    stats = speculative.engine.stats
    assert stats.num_draft_tokens > 100
    assert stats.num_accepted_tokens < stats.num_draft_tokens


def test_logprobs_with_drafts_are_plain_decodings(tiny_model_dir: Path) -> None:
    """Logprobs of kept drafts and of the token after them, as plain decoding reports them."""
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3)
    batch = prompts(8, seed=3)
    expected = [output.outputs[0] for output in llm(tiny_model_dir).generate(batch, params)]
    speculative = llm(tiny_model_dir, speculative_config=draft_config(tiny_model_dir))
    got = [output.outputs[0] for output in speculative.generate(batch, params)]
    assert speculative.engine.stats.num_accepted_tokens > 100
    for ours, theirs in zip(got, expected, strict=True):
        assert ours.token_ids == theirs.token_ids
        assert ours.logprobs is not None
        assert theirs.logprobs is not None
        assert len(ours.logprobs) == len(theirs.logprobs) == 24
        for mine, reference in zip(ours.logprobs, theirs.logprobs, strict=True):
            assert mine.token_id == reference.token_id
            assert mine.logprob == pytest.approx(reference.logprob, abs=1e-4)
            assert [t for t, _ in mine.top] == [t for t, _ in reference.top]
            assert [v for _, v in mine.top] == pytest.approx(
                [v for _, v in reference.top], abs=1e-4
            )


def test_greedy_is_identical_under_preemption(
    tiny_model_dir: Path, plain: list[tuple[int, ...]]
) -> None:
    starved = llm(tiny_model_dir, num_kv_blocks=14, speculative_config=draft_config(tiny_model_dir))
    assert tokens(starved.generate(prompts(50, seed=0), GREEDY)) == plain
    assert starved.engine.scheduler.num_preemptions > 0
    assert starved.engine.stats.num_accepted_tokens > 0
    proposer = starved.engine.core.draft_proposer
    assert proposer is not None
    assert proposer.num_free_blocks == 14


def test_the_draft_is_planned_and_charged_to_its_own_owners(
    tiny_model_dir: Path, other_draft_dir: Path
) -> None:
    max_batch_size = 3
    engine = build_engine(
        EngineArgs(
            model=str(tiny_model_dir),
            dtype="float32",
            quantization="none",
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=max_batch_size,
            speculative_config=draft_config(other_draft_dir),
        )
    )
    live = engine.ledger.live_bytes_by_owner()
    assert live == engine.plan.allocated_by_owner()
    proposer = engine.core.draft_proposer
    assert proposer is not None
    draft = proposer.model
    weights = sum(p.nbytes for p in draft.parameters()) + sum(b.nbytes for b in draft.buffers())
    assert live[DRAFT_MODEL] == weights
    # One layer, one KV head of 16 values, K and V in float32, in blocks of 16 tokens: one
    # draft block for each of the target's blocks.
    assert live[DRAFT_KV_POOL] == engine.num_kv_blocks * 16 * (2 * 16 * 4)
    assert live[DRAFT_KV_POOL] == proposer.kv_caches.num_bytes
    # Each block the plan bought costs the target's block and the draft's.
    plan = engine.plan
    assert plan.kv_blocks * (plan.kv_block_bytes + 16 * 2 * 16 * 4) == (
        live["kv_pool"] + live[DRAFT_KV_POOL]
    )


def test_the_draft_takes_its_own_quantization(tiny_model_dir: Path, other_draft_dir: Path) -> None:
    speculative = attrs.evolve(draft_config(other_draft_dir), quantization="int8")
    engine = build_engine(
        EngineArgs(
            model=str(tiny_model_dir),
            dtype="float32",
            quantization="none",
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=2,
            speculative_config=speculative,
        )
    )
    draft = engine.plan.inputs.draft
    assert draft is not None
    assert draft.quantization == Quantization.INT8
    assert engine.loaded.quantization == Quantization.NONE
    assert engine.ledger.live_bytes_by_owner() == engine.plan.allocated_by_owner()


def test_a_draft_with_another_tokenizer_is_refused(
    tiny_model_dir: Path, other_draft_dir: Path, tmp_path: Path
) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    shutil.copytree(other_draft_dir, tmp_path, dirs_exist_ok=True)
    backend = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    backend.add_tokens(["<an extra token>"])
    backend.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="does not share the target's tokenizer"):
        llm(tiny_model_dir, speculative_config=draft_config(tmp_path))


def test_a_missing_draft_names_the_flag(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--speculative-config model"):
        llm(tiny_model_dir, speculative_config=draft_config(tmp_path / "nothing"))
