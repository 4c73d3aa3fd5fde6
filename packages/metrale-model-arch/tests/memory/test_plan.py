"""``plan_memory`` on a tiny Llama whose every term is computed by hand."""

from __future__ import annotations

import pytest

from metrale_config import ModelConfig
from metrale_model_arch.memory import (
    BUFFER_ARENA,
    DRAFT_KV_POOL,
    DRAFT_MODEL,
    KV_POOL,
    LINEAR_STATE_POOL,
    PER_SEQUENCE_STATE,
    ROPE_TABLE,
    RUNTIME_HEADROOM,
    DraftInputs,
    MemoryPlanError,
    PlanInputs,
    plan_memory,
    weight_bytes,
)

# Tiny Llama (see conftest): vocab 1000, hidden 64, intermediate 128, 2 layers, 4 heads of 16,
# 2 KV heads, untied, float32.
EMBEDDINGS = 1000 * 64 * 4  # 256_000
# per layer: q 64x64 + k,v 2 x 64x32 + o 64x64 = 12_288; MLP 3 x 64x128 = 24_576; norms 128
LAYERS = 2 * (12_288 + 24_576 + 128) * 4  # 295_936
FINAL_NORM = 64 * 4
LM_HEAD = EMBEDDINGS
ROPE = 256 * 16 * 4  # 16_384
PRE_KV = EMBEDDINGS + LAYERS + FINAL_NORM + LM_HEAD + ROPE  # 824_576
BLOCK = 16 * 512  # 16 tokens x 512 B
HEADROOM = 512 * 2**20 + 1_703_936  # see test_kv_price
ARENA_FIXED = 3 * 128 * 8  # ids + positions + KV slots for 128 tokens
ARENA_PER_SLOT = 1000 * 4 + 16 * 8  # one logits row + one block-table row (256 / 16 blocks)


def inputs(total_bytes: int, **overrides: object) -> PlanInputs:
    values: dict[str, object] = {
        "device_kind": "cpu",
        "total_bytes": total_bytes,
        "gpu_memory_utilization": 1.0,
        "dtype_bytes": 4,
        "max_seq_len": 256,
        "block_size": 16,
        "max_batch_size": 4,
        "max_batch_tokens": 128,
        **overrides,
    }
    return PlanInputs(**values)  # type: ignore[arg-type]


def reserve(slots: int) -> int:
    return HEADROOM + ARENA_FIXED + slots * ARENA_PER_SLOT


def test_weights_by_owner(tiny_llama: ModelConfig) -> None:
    assert weight_bytes(tiny_llama, 4).by_owner() == {
        "weights.embeddings": EMBEDDINGS,
        "weights.layers": LAYERS,
        "weights.final_norm": FINAL_NORM,
        "weights.lm_head": LM_HEAD,
    }
    assert PRE_KV == 824_576


def test_kv_pool_is_clamped_to_what_the_slots_can_use(tiny_llama: ModelConfig) -> None:
    plan = plan_memory(tiny_llama, inputs(2**30))
    # 2^30 - 824_576 - reserve(4) = 534_322_816 bytes fit 65_224 blocks; 4 slots x 16 blocks
    assert (2**30 - PRE_KV - reserve(4)) // BLOCK == 65_224
    assert plan.kv_blocks == 64
    assert plan.max_kv_tokens == 1024
    assert plan.admitted_sequences == 4
    assert plan.by_owner() == {
        "weights.embeddings": EMBEDDINGS,
        "weights.layers": LAYERS,
        "weights.final_norm": FINAL_NORM,
        "weights.lm_head": LM_HEAD,
        ROPE_TABLE: ROPE,
        KV_POOL: 64 * BLOCK,
        PER_SEQUENCE_STATE: 0,
        LINEAR_STATE_POOL: 0,
        BUFFER_ARENA: ARENA_FIXED + 4 * ARENA_PER_SLOT,
        RUNTIME_HEADROOM: HEADROOM,
    }
    assert plan.used_bytes == sum(plan.by_owner().values())
    assert set(plan.allocated_by_owner()) == {
        "weights.embeddings",
        "weights.layers",
        "weights.final_norm",
        "weights.lm_head",
        ROPE_TABLE,
        KV_POOL,
        BUFFER_ARENA,
    }


def test_each_block_also_buys_the_draft_models_block(tiny_llama: ModelConfig) -> None:
    """The tiny Llama as its own draft: its weights are reserved, and every KV block the budget
    buys costs a target block and a draft block."""
    draft = DraftInputs(config=tiny_llama)
    # One byte short of 21 pairs of blocks (41 target blocks alone).
    total = 2 * PRE_KV + reserve(4) + 21 * (2 * BLOCK) - 1
    plan = plan_memory(tiny_llama, inputs(total, draft=draft))
    assert plan.kv_blocks == 20
    owners = plan.by_owner()
    assert owners[DRAFT_MODEL] == PRE_KV
    assert owners[KV_POOL] == owners[DRAFT_KV_POOL] == 20 * BLOCK
    assert plan.used_bytes == sum(owners.values()) == total - (2 * BLOCK - 1)
    assert {DRAFT_MODEL, DRAFT_KV_POOL} <= set(plan.allocated_by_owner())
    with pytest.raises(MemoryPlanError, match="KV cache"):
        plan_memory(tiny_llama, inputs(2 * PRE_KV + reserve(4) + 16 * (2 * BLOCK) - 1, draft=draft))


def test_utilization_scales_the_budget(tiny_llama: ModelConfig) -> None:
    plan = plan_memory(tiny_llama, inputs(2**31, gpu_memory_utilization=0.5))
    assert plan.budget_bytes == 2**30


def test_too_small_for_the_weights_is_refused_naming_the_flag(tiny_llama: ModelConfig) -> None:
    with pytest.raises(MemoryPlanError, match="--gpu-memory-utilization") as caught:
        plan_memory(tiny_llama, inputs(PRE_KV - 1))
    assert caught.value.term == "weights"


def test_too_small_for_one_full_length_sequence_is_refused(tiny_llama: ModelConfig) -> None:
    # room for 15 blocks; one 256-token sequence needs 16
    total = PRE_KV + reserve(4) + 15 * BLOCK
    with pytest.raises(MemoryPlanError, match="--max-seq-len=256") as caught:
        plan_memory(tiny_llama, inputs(total))
    assert caught.value.term == "kv_cache"
    assert "runtime_headroom" in str(caught.value)  # the largest reserve term is named
    plan = plan_memory(tiny_llama, inputs(total + BLOCK))
    assert plan.kv_blocks == 16
    assert plan.admitted_sequences == 1


def test_num_kv_blocks_must_fit(tiny_llama: ModelConfig) -> None:
    total = PRE_KV + reserve(4) + 40 * BLOCK
    assert plan_memory(tiny_llama, inputs(total, num_kv_blocks=40)).kv_blocks == 40
    with pytest.raises(MemoryPlanError, match="--num-kv-blocks=41"):
        plan_memory(tiny_llama, inputs(total, num_kv_blocks=41))


def test_auto_batch_size_admits_the_most_sequences_ties_to_fewer(
    tiny_llama: ModelConfig,
) -> None:
    # 327_680 bytes (40 blocks) past the slot-independent terms; each slot's logits row
    # costs 4_000: 1 slot fits 39 blocks (2 sequences), 2 slots 39, 3 slots 38 (2 sequences).
    total = PRE_KV + HEADROOM + ARENA_FIXED + 40 * BLOCK
    plan = plan_memory(tiny_llama, inputs(total, max_batch_size=None))
    assert plan.max_batch_size == 2
    assert plan.admitted_sequences == 2
    assert plan.kv_blocks == 32


def test_auto_batch_size_stops_at_128(tiny_llama: ModelConfig) -> None:
    plan = plan_memory(tiny_llama, inputs(2**34, max_batch_size=None))
    assert plan.max_batch_size == 128
    assert plan.kv_blocks == 128 * 16


def test_auto_batch_size_refuses_when_one_slot_does_not_fit(tiny_llama: ModelConfig) -> None:
    with pytest.raises(MemoryPlanError) as caught:
        plan_memory(tiny_llama, inputs(PRE_KV + reserve(1), max_batch_size=None))
    assert caught.value.term == "kv_cache"


@pytest.mark.parametrize(("max_seq_len", "flat"), [(16384, 92_454_912), (131072, 739_639_296)])
def test_glm5_next_flat_indexer_is_reserved_per_slot(
    glm5_next: ModelConfig, max_seq_len: int, flat: int
) -> None:
    common = {"device_kind": "cuda", "dtype_bytes": 2, "max_seq_len": max_seq_len}
    paged = plan_memory(glm5_next, inputs(1200 * 2**30, indexer_paged=True, **common))
    flat_plan = plan_memory(glm5_next, inputs(1200 * 2**30, indexer_paged=False, **common))
    assert paged.per_sequence_reserve_bytes == 0
    assert flat_plan.per_sequence_reserve_bytes == 4 * flat
    assert paged.kv_bytes_per_token == 16_896
    assert flat_plan.kv_bytes_per_token == 11_264
