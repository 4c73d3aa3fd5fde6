from __future__ import annotations

import attrs
import pytest
import torch

from metrale_config import ModelConfig
from metrale_model_arch.kv_cache import allocate_kv_cache, kv_cache_bytes_per_token


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


def test_allocation_is_one_zeroed_tensor_sliced_per_layer(tiny_config: ModelConfig) -> None:
    caches = allocate_kv_cache(
        tiny_config, num_blocks=5, block_size=4, dtype=torch.float16, device="cpu"
    )
    assert len(caches) == tiny_config.num_hidden_layers
    base = caches[0][0]._base
    assert base is not None
    assert base.shape == (2, 2, 5, 4, 2, 8)
    assert base.dtype == torch.float16
    assert torch.count_nonzero(base) == 0
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
