"""GLM-5.3 in the engine: per-sequence state (KDA recurrent and conv state, the flat indexer)
carried across chunks, rebuilt after preemption, never shared between sequences; prefix
caching off for it; the plan equal to the allocation ledger in both indexer layouts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from metrale_config import model_config_from_hf_file
from metrale_model_arch.memory import KV_POOL
from metrale_model_arch.memory.seq_state_reserve import per_sequence_state_bytes
from metrale_model_arch.owners import LINEAR_STATE_POOL, PER_SEQUENCE_STATE
from metrale_server import LLM, EngineArgs, SamplingParams, build_engine
from metrale_server.output.outputs import RequestOutput

FLAT_LEVER = "METRALE_GLM_DSA_INDEXER_FLAT"
MAX_SEQ_LEN = 256
NUM_PROMPTS = 10


def make_prompts(seed: int = 0) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    return [
        {"prompt_token_ids": [rng.randrange(100, 49152) for _ in range(rng.randint(1, 60))]}
        for _ in range(NUM_PROMPTS)
    ]


def greedy(max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def token_ids(outputs: list[RequestOutput]) -> list[tuple[int, ...]]:
    return [output.outputs[0].token_ids for output in outputs]


def glm(path: Path, **args: object) -> LLM:
    return LLM(str(path), dtype="float32", device="cpu", max_seq_len=MAX_SEQ_LEN, **args)


@pytest.fixture(scope="module")
def alone_reference(tiny_glm5_dir: Path) -> list[tuple[int, ...]]:
    llm = glm(tiny_glm5_dir, max_batch_size=1, max_batch_tokens=4096)
    return [token_ids(llm.generate([p], greedy()))[0] for p in make_prompts()]


@pytest.mark.parametrize("flat", [False, True], ids=["paged", "flat"])
def test_batched_chunked_and_preempted_equal_alone(
    tiny_glm5_dir: Path,
    alone_reference: list[tuple[int, ...]],
    monkeypatch: pytest.MonkeyPatch,
    flat: bool,
) -> None:
    if flat:
        monkeypatch.setenv(FLAT_LEVER, "1")
    batched = glm(tiny_glm5_dir, max_batch_size=8, max_batch_tokens=4096)
    assert token_ids(batched.generate(make_prompts(), greedy())) == alone_reference
    # Chunks of 23 tokens split KDA's chunks and the indexer's pools of 4.
    chunked = glm(tiny_glm5_dir, max_batch_size=8, max_batch_tokens=23)
    assert token_ids(chunked.generate(make_prompts(), greedy())) == alone_reference
    preempted = glm(tiny_glm5_dir, max_batch_size=8, max_batch_tokens=4096, num_kv_blocks=12)
    assert token_ids(preempted.generate(make_prompts(), greedy())) == alone_reference
    assert preempted.engine.scheduler.num_preemptions > 0
    assert preempted.engine.block_manager.num_free_blocks == 12


def test_prefix_caching_is_off_for_a_model_with_sequence_state(
    tiny_glm5_dir: Path, alone_reference: list[tuple[int, ...]]
) -> None:
    llm = glm(tiny_glm5_dir, max_batch_size=4, enable_prefix_caching=True)
    assert llm.engine.core.has_sequence_state
    assert not llm.engine.core.prefix_caching
    assert not llm.engine.block_manager.enable_prefix_caching
    # The same prompt twice: the second run recomputes, so its state is whole.
    prompt = make_prompts()[3]
    first, second = (token_ids(llm.generate([prompt], greedy()))[0] for _ in range(2))
    assert first == second == alone_reference[3]


def test_a_block_size_that_splits_pools_is_refused_naming_the_flag(tiny_glm5_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"--block-size 6 .*index_kpool \(4\)"):
        build_engine(EngineArgs(model=str(tiny_glm5_dir), block_size=6, max_seq_len=MAX_SEQ_LEN))


@pytest.mark.parametrize("flat", [False, True], ids=["paged", "flat"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ledger_equals_plan_and_the_seed_formula(
    tiny_glm5_dir: Path, monkeypatch: pytest.MonkeyPatch, flat: bool, dtype: str
) -> None:
    if flat:
        monkeypatch.setenv(FLAT_LEVER, "1")
    max_batch_size = 3
    engine = build_engine(
        EngineArgs(
            model=str(tiny_glm5_dir),
            dtype=dtype,
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=max_batch_size,
        )
    )
    live = engine.ledger.live_bytes_by_owner()
    assert live == engine.plan.allocated_by_owner()
    config = model_config_from_hf_file(tiny_glm5_dir)
    seed = per_sequence_state_bytes(config, MAX_SEQ_LEN, False, indexer_paged=not flat)
    # Two DSA layers; each flat indexer row is 16 float32 values and a flag byte; pools of 4.
    assert seed.target_layers == (2 * MAX_SEQ_LEN * (16 * 4 + 1) if flat else 0)
    assert live.get(PER_SEQUENCE_STATE, 0) == seed.for_batch(max_batch_size)
    # Two KDA layers: float32 state (2 heads x 16 x 16) and 3 conv inputs of 3 x 2 x 16 channels,
    # for each sequence plus the dummy slot.
    per_slot = 2 * (2 * 16 * 16 + 3 * 2 * 16 * 3) * 4
    assert live[LINEAR_STATE_POOL] == per_slot * (max_batch_size + 1)
    dtype_bytes = 4 if dtype == "float32" else 2
    latent = 2 * 16 * dtype_bytes
    # Paged: 16 float32 values per token in each DSA layer (the shared layer's as the seed
    # plans them, though it reads the full layer's selection).
    indexer = 0 if flat else 2 * 16 * 4
    assert engine.plan.kv_bytes_per_token == latent + indexer
    assert live[KV_POOL] == engine.num_kv_blocks * 16 * engine.plan.kv_bytes_per_token
