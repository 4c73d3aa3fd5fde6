"""Inverse-frequency rules and the cos/sin table against transformers' RoPE code."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from metrale_kernels import (
    cos_sin_cache,
    default_inv_freq,
    dynamic_ntk_inv_freq,
    linear_inv_freq,
    llama3_inv_freq,
)

HEAD_DIMS = [16, 64, 128]
BASES = [10000.0, 500000.0]


def llama_config(head_dim: int, max_position_embeddings: int, **rope: Any) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=rope,
    )


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", BASES)
def test_default_matches_hf(head_dim: int, base: float) -> None:
    config = llama_config(head_dim, 2048, rope_type="default", rope_theta=base)
    expected, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    out = default_inv_freq(head_dim, base)
    assert out.dtype == torch.float32
    assert out.shape == (head_dim // 2,)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("factor", [2.0, 4.5])
def test_linear_matches_hf(head_dim: int, base: float, factor: float) -> None:
    config = llama_config(head_dim, 2048, rope_type="linear", rope_theta=base, factor=factor)
    expected, attention_scaling = ROPE_INIT_FUNCTIONS["linear"](config)
    assert attention_scaling == 1.0
    out = linear_inv_freq(head_dim, base, factor=factor)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize(
    ("factor", "low_freq_factor", "high_freq_factor", "original_max"),
    [(8.0, 1.0, 4.0, 8192), (32.0, 1.0, 4.0, 8192), (4.0, 2.0, 8.0, 1024)],
)
def test_llama3_matches_hf(
    head_dim: int,
    base: float,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max: int,
) -> None:
    config = llama_config(
        head_dim,
        original_max * 16,
        rope_type="llama3",
        rope_theta=base,
        factor=factor,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        original_max_position_embeddings=original_max,
    )
    expected, attention_scaling = ROPE_INIT_FUNCTIONS["llama3"](config)
    assert attention_scaling == 1.0
    out = llama3_inv_freq(
        head_dim,
        base,
        factor=factor,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        original_max_position_embeddings=original_max,
    )
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    # The rule must really scale something for these parameters, or the test proves little.
    assert not torch.equal(out, default_inv_freq(head_dim, base))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("max_positions", [1, 100, 2048])
def test_dynamic_is_default_within_the_original_window(head_dim: int, max_positions: int) -> None:
    config = llama_config(head_dim, 2048, rope_type="dynamic", rope_theta=10000.0, factor=4.0)
    # HF's table at init, i.e. for any context that fits max_position_embeddings.
    expected, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=max_positions)
    out = dynamic_ntk_inv_freq(
        head_dim,
        10000.0,
        factor=4.0,
        original_max_position_embeddings=2048,
        max_positions=max_positions,
    )
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(out, default_inv_freq(head_dim, 10000.0), rtol=0, atol=0)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize(("factor", "max_positions"), [(2.0, 2049), (4.0, 5000), (8.0, 16384)])
def test_dynamic_beyond_the_window_is_hf_at_max_positions(
    head_dim: int, factor: float, max_positions: int
) -> None:
    """Past the original window, the table is HF's for a context of exactly max_positions.

    HF recomputes the base on every forward from the current length; a paged cache keeps keys
    rotated once, so the table is fixed at the served maximum. It therefore equals HF when the
    context is max_positions long and uses a larger base than HF for shorter contexts.
    """
    config = llama_config(head_dim, 2048, rope_type="dynamic", rope_theta=10000.0, factor=factor)
    expected, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=max_positions)
    out = dynamic_ntk_inv_freq(
        head_dim,
        10000.0,
        factor=factor,
        original_max_position_embeddings=2048,
        max_positions=max_positions,
    )
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    shorter, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=(2048 + max_positions) // 2)
    assert (out[1:] < shorter[1:]).all()


def test_dynamic_table_matches_hf_rotary_forward_at_full_context() -> None:
    config = llama_config(32, 64, rope_type="dynamic", rope_theta=10000.0, factor=2.0)
    positions = torch.arange(200)
    cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1), positions[None])
    inv_freq = dynamic_ntk_inv_freq(
        32, 10000.0, factor=2.0, original_max_position_embeddings=64, max_positions=200
    )
    table = cos_sin_cache(inv_freq, 200)
    torch.testing.assert_close(table, torch.cat([cos[0, :, :16], sin[0, :, :16]], dim=-1))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("max_positions", [1, 37, 4096])
def test_cos_sin_cache_layout_matches_hf_rotary_forward(head_dim: int, max_positions: int) -> None:
    config = llama_config(head_dim, 8192, rope_type="default", rope_theta=10000.0)
    cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1), torch.arange(max_positions)[None])
    table = cos_sin_cache(default_inv_freq(head_dim, 10000.0), max_positions)
    half = head_dim // 2
    assert table.shape == (max_positions, head_dim)
    assert table.dtype == torch.float32
    torch.testing.assert_close(table[:, :half], cos[0, :, :half], rtol=0, atol=0)
    torch.testing.assert_close(table[:, half:], sin[0, :, :half], rtol=0, atol=0)
