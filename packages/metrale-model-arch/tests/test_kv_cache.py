from __future__ import annotations

import ctypes
import mmap

import attrs
import pytest
import torch
from metrale_testing.recording_allocator import RecordingAllocator

from metrale_config import ModelConfig, MoeConfig, model_config_from_hf_dict
from metrale_model_arch.kv_cache import (
    allocate_kv_cache,
    allocate_state_slots,
    kv_cache_bytes_per_token,
)
from metrale_model_arch.kv_cache_dtype import KvCacheDtype
from metrale_model_arch.memory.kv_price import kv_bytes_per_token
from metrale_model_arch.memory.plan import PlanInputs, plan_memory
from metrale_model_arch.owners import KV_POOL, LINEAR_STATE_POOL, PER_SEQUENCE_STATE


def test_bytes_per_token_tiny(tiny_config: ModelConfig) -> None:
    # 2 layers x (K + V) x 2 kv heads x head_dim 8 x 2 bytes
    assert kv_cache_bytes_per_token(tiny_config, torch.float16) == 2 * 2 * 2 * 8 * 2 == 128
    assert kv_cache_bytes_per_token(tiny_config, torch.float32) == 256


def test_bytes_per_token_llama3_8b_shape(tiny_config: ModelConfig) -> None:
    llama3_8b = attrs.evolve(
        tiny_config,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
    )
    # 32 layers x 2 x 8 heads x 128 x 2 bytes = 128 KiB per token.
    assert kv_cache_bytes_per_token(llama3_8b, torch.bfloat16) == 131_072


def test_allocation_is_one_tensor_sliced_per_layer(tiny_config: ModelConfig) -> None:
    caches = allocate_kv_cache(
        tiny_config, num_blocks=5, block_size=4, dtype=torch.float16, device="cpu"
    )
    assert len(caches) == tiny_config.num_hidden_layers
    base = caches[0][0]._base
    assert base is not None
    assert base.shape == (2, 2, 5, 4, 2, 8)
    assert base.dtype == torch.float16
    base.zero_()
    layer_bytes = 5 * 4 * 2 * 8 * 2
    for layer, (k_cache, v_cache) in enumerate(caches):
        assert k_cache.shape == v_cache.shape == (5, 4, 2, 8)
        assert k_cache.is_contiguous()
        assert v_cache.is_contiguous()
        assert k_cache._base is base
        assert v_cache._base is base
        assert k_cache.data_ptr() - base.data_ptr() == layer * layer_bytes
        assert v_cache.data_ptr() - base.data_ptr() == (2 + layer) * layer_bytes
    caches[1][1][3, 2] = 1.0
    assert base[1, 1, 3, 2].eq(1.0).all()
    assert torch.count_nonzero(base) == 2 * 8


def _resident_bytes(tensor: torch.Tensor) -> int:
    # mincore walks this range's page tables, so the count is exact; the process-wide RssAnon
    # counter is updated lazily per thread and once read 0 bytes grown in CI.
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    start = tensor.data_ptr() - tensor.data_ptr() % page
    length = tensor.data_ptr() + tensor.nbytes - start
    residency = (ctypes.c_ubyte * ((length + page - 1) // page))()
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), residency) != 0:
        pytest.skip(f"mincore failed: errno {ctypes.get_errno()}")
    return sum(flag & 1 for flag in residency) * page


def test_the_pool_becomes_resident_only_as_it_fills(tiny_config: ModelConfig) -> None:
    # 2 x 2 layers x 32768 blocks x 64 tokens x 2 heads x 8 x 4 bytes = 512 MiB, never touched.
    # NOTE: more than glibc's heap may keep free (the cpu backend's trim threshold, 256 MiB),
    # so the pool is fresh pages whatever earlier tests in this process freed.
    caches = allocate_kv_cache(
        tiny_config, num_blocks=32768, block_size=64, dtype=torch.float32, device="cpu"
    )
    assert caches.num_bytes == 512 * 2**20
    base = caches[0][0]._base
    assert base is not None
    assert _resident_bytes(base) < 4 * 2**20
    caches[0][0][:4096].fill_(1.0)  # 16 MiB: a quarter of one of the four layer tensors
    assert 16 * 2**20 <= _resident_bytes(base) < 24 * 2**20


def test_total_size_matches_bytes_per_token(tiny_config: ModelConfig) -> None:
    caches = allocate_kv_cache(
        tiny_config, num_blocks=3, block_size=16, dtype=torch.bfloat16, device="cpu"
    )
    base = caches[0][0]._base
    assert base is not None
    total_bytes = base.numel() * base.element_size()
    assert total_bytes == 3 * 16 * kv_cache_bytes_per_token(tiny_config, torch.bfloat16)


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 16), (4, 0)])
def test_empty_cache_is_refused(tiny_config: ModelConfig, num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        allocate_kv_cache(
            tiny_config,
            num_blocks=num_blocks,
            block_size=block_size,
            dtype=torch.float32,
            device="cpu",
        )


def family_configs(tiny: ModelConfig, glm: ModelConfig) -> dict[str, ModelConfig]:
    moe = MoeConfig(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        mlp_layer_types=("sparse",) * 2,
    )
    return {
        "llama": tiny,
        "mistral": attrs.evolve(tiny, model_type="mistral", sliding_window=8),
        "qwen2": attrs.evolve(tiny, model_type="qwen2", qkv_bias=True),
        "qwen3": attrs.evolve(tiny, model_type="qwen3", qk_norm=True, head_dim=16),
        "qwen3_moe": attrs.evolve(tiny, model_type="qwen3_moe", qk_norm=True, moe=moe),
        "mixtral": attrs.evolve(tiny, model_type="mixtral", moe=moe),
        "glm5_next": glm,
    }


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "glm5_next"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("indexer_paged", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
def test_pool_allocates_exactly_the_plan_price(
    tiny_config: ModelConfig,
    tiny_glm5_next: ModelConfig,
    family: str,
    dtype: torch.dtype,
    indexer_paged: bool,
) -> None:
    config = family_configs(tiny_config, tiny_glm5_next)[family]
    allocator = RecordingAllocator()
    pool = allocate_kv_cache(
        config,
        num_blocks=3,
        block_size=4,
        dtype=dtype,
        device="cpu",
        allocator=allocator,
        indexer_paged=indexer_paged,
    )
    per_token = kv_bytes_per_token(config, dtype.itemsize, indexer_paged=indexer_paged)
    assert allocator.bytes_by_owner == {KV_POOL: 3 * 4 * per_token}
    assert pool.num_bytes == 3 * 4 * per_token
    assert len(pool) == config.num_hidden_layers
    assert (pool.num_blocks, pool.block_size) == (3, 4)
    layer_bytes = sum(t.numel() * t.element_size() for layer in pool for t in layer)
    assert layer_bytes == 3 * 4 * per_token


def test_glm5_next_layers_hold_latent_and_indexer_keys(tiny_glm5_next: ModelConfig) -> None:
    pool = allocate_kv_cache(
        tiny_glm5_next, num_blocks=3, block_size=4, dtype=torch.bfloat16, device="cpu"
    )
    kda, dsa, _, dsa_3 = pool
    assert kda == ()
    latent, index_keys = dsa
    assert latent.shape == (3, 4, 16)
    assert latent.dtype == torch.bfloat16
    assert index_keys.shape == (3, 4, 8)
    assert index_keys.dtype == torch.float32
    assert dsa_3[0]._base is latent._base
    flat = allocate_kv_cache(
        tiny_glm5_next,
        num_blocks=3,
        block_size=4,
        dtype=torch.bfloat16,
        device="cpu",
        indexer_paged=False,
    )
    assert [len(layer) for layer in flat] == [0, 1, 0, 1]


def test_copy_blocks_copies_every_paged_tensor(tiny_glm5_next: ModelConfig) -> None:
    pool = allocate_kv_cache(
        tiny_glm5_next, num_blocks=4, block_size=2, dtype=torch.float32, device="cpu"
    )
    for layer in pool:
        for tensor in layer:
            tensor.copy_(torch.randn(tensor.shape))
    before = [[tensor.clone() for tensor in layer] for layer in pool]
    pool.copy_blocks(torch.tensor([0, 2]), torch.tensor([3, 1]))
    for layer, old in zip(pool, before, strict=True):
        for tensor, previous in zip(layer, old, strict=True):
            assert torch.equal(tensor[3], previous[0])
            assert torch.equal(tensor[1], previous[2])
            assert torch.equal(tensor[0], previous[0])
            assert torch.equal(tensor[2], previous[2])


def test_llama_has_no_state_slots(tiny_config: ModelConfig) -> None:
    allocator = RecordingAllocator()
    slots = allocate_state_slots(
        tiny_config,
        num_slots=4,
        max_seq_len=64,
        dtype=torch.float32,
        device="cpu",
        allocator=allocator,
    )
    assert allocator.bytes_by_owner == {}
    assert [layer for layer in slots.layers] == [(), ()]


@pytest.mark.parametrize("indexer_paged", [True, False])
@pytest.mark.parametrize("max_batch_size", [1, 8])
def test_state_slots_allocate_exactly_the_plan_reserve(
    max_batch_size: int, indexer_paged: bool
) -> None:
    """transformers' full-size GLM-5.3, on the meta device: no memory is touched."""
    transformers = pytest.importorskip("transformers")
    config = model_config_from_hf_dict(
        transformers.Glm5NextConfig().to_dict(), source="Glm5NextConfig()"
    )
    max_seq_len = 16384
    allocator = RecordingAllocator()
    allocate_state_slots(
        config,
        num_slots=max_batch_size,
        max_seq_len=max_seq_len,
        dtype=torch.bfloat16,
        device="meta",
        allocator=allocator,
        indexer_paged=indexer_paged,
    )
    plan = plan_memory(
        config,
        PlanInputs(
            device_kind="cuda",
            total_bytes=1200 * 2**30,
            gpu_memory_utilization=0.9,
            dtype_bytes=2,
            max_seq_len=max_seq_len,
            max_batch_size=max_batch_size,
            indexer_paged=indexer_paged,
        ),
    )
    planned = plan.allocated_by_owner()
    expected = {LINEAR_STATE_POOL: planned[LINEAR_STATE_POOL]}
    if not indexer_paged:
        expected[PER_SEQUENCE_STATE] = planned[PER_SEQUENCE_STATE]
    assert allocator.bytes_by_owner == expected
    assert planned[LINEAR_STATE_POOL] == (max_batch_size + 1) * 152_633_344


def test_state_slots_index_by_slot_and_reset(tiny_glm5_next: ModelConfig) -> None:
    slots = allocate_state_slots(
        tiny_glm5_next,
        num_slots=3,
        max_seq_len=10,
        dtype=torch.bfloat16,
        device="cpu",
        indexer_paged=False,
    )
    recurrent, conv = slots[0]
    assert recurrent.shape == (4, 2, 8, 8)  # 3 slots + the dummy
    assert conv.shape == (4, 48, 3)
    assert recurrent.dtype == torch.float32
    index_keys, index_flags = slots[1]
    assert index_keys.shape == (3, 8, 8)  # capacity 10 -> 8 tokens (pools of 4)
    assert index_flags.shape == (3, 8)
    assert index_flags.dtype == torch.uint8
    for layer in slots.layers:
        for tensor in layer:
            tensor.fill_(1)
    slots.reset(1)
    for layer in slots.layers:
        for tensor in layer:
            assert torch.count_nonzero(tensor[1]) == 0
            assert bool((tensor[0] == 1).all())
            assert bool((tensor[2] == 1).all())
    with pytest.raises(IndexError):
        slots.reset(3)


QUANTIZED = [KvCacheDtype.INT8, KvCacheDtype.FP8_E4M3, KvCacheDtype.FP8_E5M2]


@pytest.mark.parametrize("kv_cache_dtype", QUANTIZED)
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "glm5_next"])
def test_a_quantized_pool_allocates_exactly_the_plan_price(
    tiny_config: ModelConfig,
    tiny_glm5_next: ModelConfig,
    family: str,
    kv_cache_dtype: KvCacheDtype,
) -> None:
    config = family_configs(tiny_config, tiny_glm5_next)[family]
    allocator = RecordingAllocator()
    pool = allocate_kv_cache(
        config,
        num_blocks=3,
        block_size=4,
        dtype=torch.bfloat16,
        device="cpu",
        allocator=allocator,
        kv_cache_dtype=kv_cache_dtype,
    )
    per_token = kv_bytes_per_token(config, 2, indexer_paged=True, kv_cache_dtype=kv_cache_dtype)
    # Each layer: K and V of kv_heads rows of head_dim one-byte values + a 2-byte scale.
    heads, dim = config.num_key_value_heads, config.head_dim
    assert per_token == config.num_hidden_layers * 2 * heads * (dim + 2)
    assert allocator.bytes_by_owner == {KV_POOL: 3 * 4 * per_token}
    k_cache, v_cache = pool[0]
    assert k_cache.dtype == v_cache.dtype == _STORAGE[kv_cache_dtype]
    assert k_cache.shape == (3, 4, heads, dim + 2)


_STORAGE = {
    KvCacheDtype.INT8: torch.int8,
    KvCacheDtype.FP8_E4M3: torch.float8_e4m3fn,
    KvCacheDtype.FP8_E5M2: torch.float8_e5m2,
}


def test_the_same_budget_holds_about_twice_the_bf16_tokens(tiny_config: ModelConfig) -> None:
    llama3_8b = attrs.evolve(
        tiny_config, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128,
    )  # fmt: skip
    plans = {
        kv: plan_memory(
            llama3_8b,
            PlanInputs(
                device_kind="cuda",
                total_bytes=80 * 2**30,
                gpu_memory_utilization=0.9,
                dtype_bytes=2,
                max_seq_len=8192,
                max_batch_size=256,
                kv_cache_dtype=kv,
            ),
        )
        for kv in (KvCacheDtype.AUTO, KvCacheDtype.INT8)
    }
    auto, int8 = plans[KvCacheDtype.AUTO], plans[KvCacheDtype.INT8]
    assert int8.kv_bytes_per_token == 32 * 2 * 8 * 130
    assert int8.max_kv_tokens >= 1.9 * auto.max_kv_tokens
    # The same bytes, in whole blocks of each size.
    assert abs(int8.by_owner()[KV_POOL] - auto.by_owner()[KV_POOL]) < auto.kv_block_bytes


def test_an_mla_latent_is_refused_by_name(tiny_glm5_next: ModelConfig) -> None:
    with pytest.raises(ValueError, match="--kv-cache-dtype int8: glm5_next's MLA latent"):
        kv_bytes_per_token(tiny_glm5_next, 2, indexer_paged=True, kv_cache_dtype=KvCacheDtype.INT8)


@pytest.mark.parametrize("name", ["fp8", "fp8_e4m3"])
def test_fp8_is_e4m3_as_in_vllm(name: str) -> None:
    assert KvCacheDtype.parse(name) is KvCacheDtype.FP8_E4M3


def test_an_unknown_kv_cache_dtype_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--kv-cache-dtype 'fp4': choose one of auto, fp8,"):
        KvCacheDtype.parse("fp4")


def test_copy_blocks_copies_quantized_blocks(tiny_config: ModelConfig) -> None:
    pool = allocate_kv_cache(
        tiny_config,
        num_blocks=4,
        block_size=2,
        dtype=torch.float32,
        device="cpu",
        kv_cache_dtype=KvCacheDtype.FP8_E4M3,
    )
    for allocation in pool.allocations:
        allocation.view(torch.uint8).copy_(
            torch.randint(0, 255, allocation.shape, dtype=torch.uint8)
        )
    pool.copy_blocks(torch.tensor([0]), torch.tensor([3]))
    for k_cache, v_cache in pool:
        assert torch.equal(k_cache[3].view(torch.uint8), k_cache[0].view(torch.uint8))
        assert torch.equal(v_cache[3].view(torch.uint8), v_cache[0].view(torch.uint8))
