"""The ring math of sliding-window layers, against hand-computed numbers, and which layers a
ring takes (the published configs: Gemma-3-27B, gpt-oss-120b, Mistral-7B; a qwen2 whose last
layers slide)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from metrale_config import ModelConfig, model_config_from_hf_dict, model_config_from_hf_file
from metrale_model_arch.cache_spec import (
    FullAttentionSpec,
    SlidingWindowRingSpec,
    SlidingWindowSpec,
    StateTensor,
)
from metrale_model_arch.kv_cache_dtype import KvCacheDtype
from metrale_model_arch.memory import (
    SLIDING_WINDOW_KV,
    MemoryPlan,
    PlanInputs,
    kv_bytes_per_token,
    plan_memory,
    sliding_window_kv_bytes,
    sliding_window_kv_bytes_per_slot,
)
from metrale_model_arch.registry import cache_specs
from metrale_model_arch.sliding_window_ring import (
    RingLayout,
    SlidingWindowCache,
    ring_blocks,
    ring_step_cap,
    ring_step_tokens,
)

DATA = Path(__file__).parent / "data"
GEMMA3_27B = DATA / "gemma-3-27b-it" / "config.json"
GPT_OSS_120B = DATA / "gpt-oss-120b" / "config.json"
LAYOUT = RingLayout(block_size=16, max_batch_tokens=2048, max_seq_len=16384)
# Mistral-7B-v0.1's config.json (a window of 4096 on every layer).
MISTRAL_7B: dict[str, object] = {
    "architectures": ["MistralForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}


def test_step_tokens_are_the_window_at_least_512_within_the_step_budget() -> None:
    assert ring_step_tokens(128, 2048) == 512
    assert ring_step_tokens(1024, 2048) == 1024
    assert ring_step_tokens(4096, 2048) == 2048
    assert ring_step_tokens(128, 16) == 16


def test_ring_blocks_hold_the_window_and_a_step_and_one_block_more() -> None:
    # 127 + 512 = 639 tokens: 40 blocks of 16, and one more.
    assert ring_blocks(128, 512, 16) == 41
    # 1023 + 1024 = 2047: 128 blocks, and one more.
    assert ring_blocks(1024, 1024, 16) == 129
    # 8 + 16 = 24 tokens: exactly 6 blocks of 4, and one more.
    assert ring_blocks(9, 16, 4) == 7


def test_a_layer_stays_in_the_pool_where_its_ring_would_hold_the_whole_context() -> None:
    spec = SlidingWindowSpec(num_kv_heads=8, head_dim=64, sliding_window=128)
    assert attrs.evolve(LAYOUT, max_seq_len=656).ring_spec(spec) is None
    ring = attrs.evolve(LAYOUT, max_seq_len=657).ring_spec(spec)
    assert ring == SlidingWindowRingSpec(
        attention=spec, ring_blocks=41, block_size=16, step_tokens=512
    )
    assert ring.paged() == ()
    # K and V: 656 tokens of (8 heads, 64) each, per slot.
    assert ring.state(657) == tuple(
        StateTensor(role=role, shape=(656, 8, 64), dtype="model", owner=SLIDING_WINDOW_KV)
        for role in ("k", "v")
    )
    assert ring.state_bytes_per_slot(SLIDING_WINDOW_KV, 657, 2) == 2 * 656 * 8 * 64 * 2


def test_gpt_oss_120b_rings_its_18_sliding_layers() -> None:
    config = model_config_from_hf_file(GPT_OSS_120B)
    specs = cache_specs(config, indexer_paged=True, ring=LAYOUT)
    rings = [s for s in specs if isinstance(s, SlidingWindowRingSpec)]
    assert len(rings) == 18
    assert sum(type(s) is FullAttentionSpec for s in specs) == 18
    assert ring_step_cap(specs) == 512
    # The pool prices the 18 full layers; each slot 18 rings of 41 x 16 tokens, K and V.
    assert kv_bytes_per_token(config, 2, indexer_paged=True, ring=LAYOUT) == 18 * 2 * 8 * 64 * 2
    per_slot = 18 * 2 * 656 * 8 * 64 * 2
    assert sliding_window_kv_bytes_per_slot(config, 2, LAYOUT) == per_slot
    assert sliding_window_kv_bytes(config, 8, 2, LAYOUT) == 8 * per_slot


def test_gemma3_27b_rings_52_of_its_62_layers_quantized_as_the_pool() -> None:
    config = model_config_from_hf_file(GEMMA3_27B)
    specs = cache_specs(config, indexer_paged=True, kv_cache_dtype=KvCacheDtype.INT8, ring=LAYOUT)
    rings = [s for s in specs if isinstance(s, SlidingWindowRingSpec)]
    assert len(rings) == 52
    # window 1024 + 1024 a step: 129 blocks of 16; int8 rows of 128 values and a 2-byte scale.
    assert {(r.ring_blocks, r.attention.kv_dtype) for r in rings} == {(129, "int8")}
    per_slot = sliding_window_kv_bytes_per_slot(config, 2, LAYOUT, kv_cache_dtype=KvCacheDtype.INT8)
    assert per_slot == 52 * 2 * 129 * 16 * 16 * (128 + 2)


def test_mistral_7b_rings_every_layer() -> None:
    config = model_config_from_hf_dict(MISTRAL_7B, source="Mistral-7B-v0.1")
    specs = cache_specs(config, indexer_paged=True, ring=LAYOUT)
    rings = [s for s in specs if isinstance(s, SlidingWindowRingSpec)]
    # window 4096 + 2048 a step: 384 blocks of 16, and one more.
    assert len(rings) == len(specs) == 32
    assert {(r.ring_blocks, r.step_tokens) for r in rings} == {(385, 2048)}
    assert kv_bytes_per_token(config, 2, indexer_paged=True, ring=LAYOUT) == 0
    per_slot = 32 * 2 * 385 * 16 * 8 * 128 * 2
    assert sliding_window_kv_bytes_per_slot(config, 2, LAYOUT) == per_slot


def test_qwen2_rings_its_layers_from_max_window_layers_on() -> None:
    qwen2 = {**MISTRAL_7B, "model_type": "qwen2", "use_sliding_window": True}
    config = model_config_from_hf_dict({**qwen2, "max_window_layers": 28}, source="qwen2")
    specs = cache_specs(config, indexer_paged=True, ring=LAYOUT)
    assert [type(s) for s in specs] == [FullAttentionSpec] * 28 + [SlidingWindowRingSpec] * 4
    # Without use_sliding_window no layer slides.
    plain = model_config_from_hf_dict({**qwen2, "use_sliding_window": False}, source="qwen2")
    specs = cache_specs(plain, indexer_paged=True, ring=LAYOUT)
    assert {type(s) for s in specs} == {FullAttentionSpec}


def plans_both_ways(config: ModelConfig, *, gib: int, slots: int) -> tuple[MemoryPlan, MemoryPlan]:
    """``config``'s bf16 plans on ``gib`` GiB of CUDA for ``slots`` sequences of 32k tokens,
    with the lever at ``ring`` and at ``full``."""
    inputs = PlanInputs(
        device_kind="cuda",
        total_bytes=gib * 2**30,
        gpu_memory_utilization=0.9,
        dtype_bytes=2,
        max_seq_len=32768,
        max_batch_size=slots,
    )
    full = attrs.evolve(inputs, sliding_window_cache=SlidingWindowCache.FULL)
    return plan_memory(config, inputs), plan_memory(config, full)


def test_the_plan_rings_mistral_7b_and_fits_every_slot_at_full_length() -> None:
    config = model_config_from_hf_dict(MISTRAL_7B, source="Mistral-7B-v0.1")
    ringed, pooled = plans_both_ways(config, gib=80, slots=32)
    assert ringed.ring is not None
    assert pooled.ring is None
    # 32 slots x 32 rings of 6160 tokens, K and V; the pool prices no layer.
    assert ringed.by_owner()[SLIDING_WINDOW_KV] == 32 * 32 * 2 * 6160 * 8 * 128 * 2
    assert ringed.kv_bytes_per_token == 0
    assert ringed.max_kv_tokens == 32 * 32768
    assert pooled.max_kv_tokens < 10 * 32768


def test_a_bad_lever_value_is_named() -> None:
    assert SlidingWindowCache.parse("full") is SlidingWindowCache.FULL
    with pytest.raises(
        ValueError, match="--sliding-window-cache 'rings': choose one of ring, full"
    ):
        SlidingWindowCache.parse("rings")


def test_the_plan_rings_where_the_pool_then_holds_more_tokens() -> None:
    config = model_config_from_hf_file(GPT_OSS_120B)
    ringed, pooled = plans_both_ways(config, gib=320, slots=64)
    assert ringed.ring == attrs.evolve(LAYOUT, max_seq_len=32768)
    assert pooled.ring is None
    assert ringed.by_owner()[SLIDING_WINDOW_KV] == 64 * 18 * 2 * 656 * 8 * 64 * 2
    assert SLIDING_WINDOW_KV not in pooled.by_owner()
    assert ringed.kv_bytes_per_token * 2 == pooled.kv_bytes_per_token
    assert ringed.max_kv_tokens > 1.8 * pooled.max_kv_tokens
    # 2 slots of 1024 tokens with 8 KV blocks of 16 fixed: 2 rings of 656 tokens cost more
    # than the 128 pool tokens they would free.
    small = attrs.evolve(ringed.inputs, max_seq_len=1024, max_batch_size=2, num_kv_blocks=8)
    assert plan_memory(config, small).ring is None


def test_a_kv_cap_holds_the_rings_and_the_pool_together() -> None:
    config = model_config_from_hf_file(GPT_OSS_120B)
    cap = 8 * 2**30
    inputs = PlanInputs(
        device_kind="cpu",
        total_bytes=320 * 2**30,
        gpu_memory_utilization=0.9,
        dtype_bytes=2,
        max_seq_len=32768,
        max_batch_size=64,
        kv_cache_max_bytes=cap,
    )
    plan = plan_memory(config, inputs)
    rings = plan.by_owner()[SLIDING_WINDOW_KV]
    assert rings == 64 * 18 * 2 * 656 * 8 * 64 * 2
    # The pool is what the cap leaves, in whole blocks of 16 tokens x 18 layers' K and V.
    assert plan.kv_blocks == (cap - rings) // (16 * 18 * 2 * 8 * 64 * 2)
