"""Sliding-window layers in a ring per sequence (``--sliding-window-cache ring``) on tiny random
gemma2, gemma3_text and gpt_oss checkpoints (and phi3, every layer sliding): windows of 8-9
tokens, blocks of 4, prompts and generations several windows long. Greedy tokens equal
transformers' and the full pool's, batched, chunked, preempted, speculating and forked (n=2);
plan == ledger with the ring priced per slot."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from metrale_testing import save_random_model
from metrale_testing.greedy import transformers_greedy

from metrale_config import model_config_from_hf_file
from metrale_model_arch import Tokenizer
from metrale_model_arch.cache_spec import SlidingWindowRingSpec
from metrale_model_arch.memory import KV_POOL, SLIDING_WINDOW_KV
from metrale_model_arch.registry import cache_specs
from metrale_server import LLM, EngineArgs, SamplingParams, build_engine
from metrale_server.speculative_config import SpeculativeConfig

from .test_dense_variant_engine import save_family

pytest.importorskip("transformers")

MAX_SEQ_LEN = 128
BLOCK_SIZE = 4
# A step's tokens: each sequence's chunk is at most this, and so is the ring's step part.
STEP_TOKENS = 16
NUM_TOKENS = 24
ENGINE: dict[str, Any] = {
    "dtype": "float32",
    "device": "cpu",
    "max_seq_len": MAX_SEQ_LEN,
    "block_size": BLOCK_SIZE,
    "max_batch_tokens": STEP_TOKENS,
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
FAMILIES = ("gemma2", "gemma3_text", "gpt_oss")
# gpt-oss: sinks, a window of 8 on every other layer, its biased MoE.
GPT_OSS = {
    "intermediate_size": 32,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "sliding_window": 8,
    "swiglu_limit": 1.5,
}


@pytest.fixture(scope="module")
def model_dirs(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> dict[str, Path]:
    dirs = {}
    for family in ("gemma2", "gemma3_text", "phi3"):
        dirs[family] = tmp_path_factory.mktemp(family)
        save_family(dirs[family], family, default_tokenizer)
    dirs["gpt_oss"] = save_random_model(
        tmp_path_factory.mktemp("gpt_oss"),
        default_tokenizer,
        "GptOssConfig",
        "GptOssForCausalLM",
        **GPT_OSS,
    )
    return dirs


def make_prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 49152) for _ in range(rng.randint(20, 44))] for _ in range(4)]


def ring_specs(llm: LLM) -> list[SlidingWindowRingSpec]:
    plan = llm.engine.plan
    specs = cache_specs(
        llm.engine.loaded.config,
        indexer_paged=True,
        kv_cache_dtype=plan.inputs.kv_cache_dtype,
        ring=plan.ring,
    )
    return [spec for spec in specs if isinstance(spec, SlidingWindowRingSpec)]


def greedy(path: Path, prompts: list[list[int]], **args: Any) -> tuple[LLM, list[list[int]]]:
    """The prompts' greedy tokens in one engine, which (unless told ``full``) rings."""
    llm = LLM(str(path), **{**ENGINE, **args})
    assert bool(ring_specs(llm)) == (args.get("sliding_window_cache") != "full")
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)
    return llm, [list(o.outputs[0].token_ids) for o in outputs]


@pytest.mark.parametrize("family", FAMILIES)
def test_ring_greedy_equals_the_full_pool_and_transformers(
    model_dirs: dict[str, Path], family: str
) -> None:
    path = model_dirs[family]
    prompts = make_prompts()
    ring, batched = greedy(path, prompts, max_batch_size=4)
    window = model_config_from_hf_file(path).sliding_window
    assert window is not None
    assert max(map(len, prompts)) + NUM_TOKENS > 5 * window
    # The ring is what ran: (window - 1 + 16) tokens in blocks of 4, one more block.
    (first, *_) = ring_specs(ring)
    assert first.ring_blocks == -(-(window - 1 + STEP_TOKENS) // BLOCK_SIZE) + 1
    assert ring.engine.core.scheduler.config.max_seq_step_tokens == STEP_TOKENS
    assert not ring.engine.core.prefix_caching
    full, full_tokens = greedy(path, prompts, max_batch_size=4, sliding_window_cache="full")
    assert not ring_specs(full)
    assert batched == full_tokens
    # Each prompt alone, and in prefill chunks of 7 tokens.
    assert greedy(path, prompts, max_batch_size=1)[1] == batched
    assert greedy(path, prompts, max_batch_size=4, max_batch_tokens=7)[1] == batched
    # Preemption and recompute: 20 blocks of 4 for 2 sequences of up to 68 tokens (the 2
    # rings, 2 x 28 tokens, hold less than the 80 the pool frees: the plan rings).
    preempted, tokens = greedy(path, prompts, max_batch_size=2, num_kv_blocks=20)
    assert preempted.engine.core.scheduler.num_preemptions > 0
    assert tokens == batched
    transformers = pytest.importorskip("transformers")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    hf_model.eval()
    for prompt, tokens in zip(prompts[:2], batched, strict=False):
        assert transformers_greedy(hf_model, prompt, NUM_TOKENS) == tokens


@pytest.mark.parametrize("drafter", ["itself", "another family"])
@pytest.mark.parametrize("family", FAMILIES)
def test_speculation_over_the_ring_keeps_greedy(
    model_dirs: dict[str, Path], family: str, drafter: str
) -> None:
    path = model_dirs[family]
    prompts = make_prompts(seed=1)
    _, plain = greedy(path, prompts, max_batch_size=4)
    other = FAMILIES[(FAMILIES.index(family) + 1) % len(FAMILIES)]
    draft = path if drafter == "itself" else model_dirs[other]
    speculative = SpeculativeConfig(
        method="draft_model", model=str(draft), num_speculative_tokens=4
    )
    llm, tokens = greedy(path, prompts, max_batch_size=4, speculative_config=speculative)
    assert ring_specs(llm)
    stats = llm.engine.stats
    assert stats.num_draft_tokens > 20
    if drafter == "itself":  # verify steps of 5 rows through the ring
        assert stats.num_accepted_tokens == stats.num_draft_tokens
    else:  # rejected drafts overwrote ring rows that no query reads again
        assert stats.num_accepted_tokens < stats.num_draft_tokens / 2
    assert tokens == plain


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_forked_outputs_go_on_from_the_parents_ring(
    model_dirs: dict[str, Path], family: str
) -> None:
    path = model_dirs[family]
    prompts = make_prompts()[:2]
    _, single = greedy(path, prompts, max_batch_size=4)
    llm = LLM(str(path), **ENGINE, max_batch_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True, n=2)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert ring_specs(llm)
    forked = [[list(choice.token_ids) for choice in output.outputs] for output in outputs]
    assert forked == [[tokens, tokens] for tokens in single]


def assert_ledger_prices_each_ring_per_slot(path: Path, num_sliding: int) -> None:
    """An engine of 3 slots over ``path``: its ledger is its plan, the pool pricing the full
    layers alone (none: no pool) and each slot holding each of ``num_sliding`` layers' ring."""
    engine = build_engine(EngineArgs(model=str(path), max_batch_size=3, **ENGINE))
    plan = engine.plan
    allocated = plan.allocated_by_owner()
    assert engine.ledger.live_bytes_by_owner() == allocated
    config = model_config_from_hf_file(path)
    window = config.sliding_window
    assert window is not None
    num_full = config.num_hidden_layers - num_sliding
    row = config.num_key_value_heads * config.head_dim * 4  # float32 K or V of one token
    assert plan.kv_bytes_per_token == num_full * 2 * row
    assert allocated.get(KV_POOL, 0) == plan.kv_blocks * BLOCK_SIZE * num_full * 2 * row
    ring_tokens = (-(-(window - 1 + STEP_TOKENS) // BLOCK_SIZE) + 1) * BLOCK_SIZE
    assert allocated[SLIDING_WINDOW_KV] == 3 * num_sliding * 2 * ring_tokens * row


@pytest.mark.parametrize("family", FAMILIES)
def test_ledger_equals_plan_with_the_ring_priced_per_slot(
    model_dirs: dict[str, Path], family: str
) -> None:
    path = model_dirs[family]
    kinds = model_config_from_hf_file(path).layer_types
    num_sliding = sum(kind == "sliding_attention" for kind in kinds)
    assert 0 < num_sliding < len(kinds)
    assert_ledger_prices_each_ring_per_slot(path, num_sliding)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e5m2"])
def test_quantized_rings_equal_the_quantized_pool(
    model_dirs: dict[str, Path], kv_cache_dtype: str
) -> None:
    path = model_dirs["gemma3_text"]
    prompts = make_prompts(seed=2)
    llm, ring = greedy(path, prompts, max_batch_size=4, kv_cache_dtype=kv_cache_dtype)
    # A ring row: 16 one-byte values and a 2-byte scale per kv head.
    (first, *_) = ring_specs(llm)
    assert first.state(MAX_SEQ_LEN)[0].shape == (first.ring_tokens, 2, 16 + 2)
    assert llm.engine.ledger.live_bytes_by_owner() == llm.engine.plan.allocated_by_owner()
    full = greedy(
        path,
        prompts,
        max_batch_size=4,
        kv_cache_dtype=kv_cache_dtype,
        sliding_window_cache="full",
    )[1]
    assert ring == full


def test_a_model_whose_every_layer_rings_keeps_nothing_in_the_pool(
    model_dirs: dict[str, Path],
) -> None:
    path = model_dirs["phi3"]  # a 9-token window on every layer
    engine = build_engine(EngineArgs(model=str(path), max_batch_size=2, **ENGINE))
    assert engine.plan.kv_bytes_per_token == 0
    allocated = engine.plan.allocated_by_owner()
    assert KV_POOL not in allocated
    assert allocated[SLIDING_WINDOW_KV] == 2 * 4 * 2 * 28 * 2 * 16 * 4
    assert engine.ledger.live_bytes_by_owner() == allocated
    prompts = make_prompts()
    _, ring = greedy(path, prompts, max_batch_size=2)
    assert ring == greedy(path, prompts, max_batch_size=2, sliding_window_cache="full")[1]


def test_a_ring_as_long_as_the_context_leaves_the_layers_in_the_pool(
    model_dirs: dict[str, Path],
) -> None:
    # max_batch_tokens 128: the ring would hold 9 - 1 + 128 tokens, more than max_seq_len.
    engine = build_engine(
        EngineArgs(model=str(model_dirs["gemma2"]), **{**ENGINE, "max_batch_tokens": 128})
    )
    assert SLIDING_WINDOW_KV not in engine.plan.by_owner()
    assert engine.core.scheduler.config.max_seq_step_tokens is None
    assert engine.core.prefix_caching


def test_a_bad_sliding_window_cache_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="sliding_window_cache must be one of ring, full"):
        EngineArgs(sliding_window_cache="window")
