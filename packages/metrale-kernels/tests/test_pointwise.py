"""The pointwise reference ops and write_kv against HF transformers and plain torch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.llama import modeling_llama as llama

from metrale_kernels import TorchBackend, cos_sin_cache, default_inv_freq, llama3_inv_freq

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 64), (2, 5, 48), (1, 1, 8)])
@pytest.mark.parametrize("seed", [0, 1])
def test_rms_norm_matches_llama_rms_norm(
    dtype: torch.dtype, shape: tuple[int, ...], seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=generator) * 3).to(dtype)
    reference = llama.LlamaRMSNorm(shape[-1], eps=1e-5)
    with torch.no_grad():
        reference.weight.copy_(torch.randn(shape[-1], generator=generator))
    reference = reference.to(dtype)
    with torch.no_grad():
        expected = reference(x)
    out = TorchBackend().rms_norm(x, reference.weight.detach(), 1e-5)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 16), (2, 4, 10)])
def test_silu_and_mul(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    half = shape[-1] // 2
    expected = torch.nn.functional.silu(x[..., :half]) * x[..., half:]
    out = TorchBackend().silu_and_mul(x)
    assert out.shape == (*shape[:-1], half)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def hf_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin the way LlamaRotaryEmbedding.forward builds them for ``positions``."""
    freqs = positions[..., None].float() * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 16), (9, 3, 64)])
@pytest.mark.parametrize("seed", [0, 1])
def test_apply_rotary_matches_hf(
    dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    num_tokens, max_positions = 11, 300
    q = torch.randn(num_tokens, num_heads, head_dim, generator=generator).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator).to(dtype)
    # Unsorted and repeated positions, as a ragged batch has them.
    positions = torch.randint(0, max_positions, (num_tokens,), generator=generator)
    inv_freq = default_inv_freq(head_dim, 10000.0)
    table = cos_sin_cache(inv_freq, max_positions)
    q_before, k_before = q.clone(), k.clone()

    q_out, k_out = TorchBackend().apply_rotary(q, k, positions, table)

    cos, sin = hf_cos_sin(inv_freq, positions, dtype)
    q_expected, k_expected = llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
    assert q_out.dtype == k_out.dtype == dtype
    torch.testing.assert_close(q_out, q_expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(k_out, k_expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(q, q_before, rtol=0, atol=0)
    torch.testing.assert_close(k, k_before, rtol=0, atol=0)


def test_apply_rotary_with_hf_rotary_embedding() -> None:
    """End to end: a llama3-scaled table against LlamaRotaryEmbedding's own cos/sin."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    generator = torch.Generator().manual_seed(4)
    positions = torch.randint(0, 512, (9,), generator=generator)
    q = torch.randn(9, 4, 32, generator=generator)
    k = torch.randn(9, 2, 32, generator=generator)
    inv_freq = llama3_inv_freq(
        32,
        500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=64,
    )
    q_out, k_out = TorchBackend().apply_rotary(q, k, positions, cos_sin_cache(inv_freq, 512))

    cos, sin = llama.LlamaRotaryEmbedding(config)(q, positions[None])
    q_expected, k_expected = llama.apply_rotary_pos_emb(q, k, cos[0], sin[0], unsqueeze_dim=1)
    torch.testing.assert_close(q_out, q_expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(k_out, k_expected, rtol=0, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    num_blocks=st.integers(1, 6),
    block_size=st.sampled_from([1, 3, 16]),
    num_kv_heads=st.integers(1, 3),
    cache_dtype=st.sampled_from(DTYPES),
    data=st.data(),
)
def test_write_kv_writes_exactly_its_slots(
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    cache_dtype: torch.dtype,
    data: st.DataObject,
) -> None:
    num_slots = num_blocks * block_size
    slots = data.draw(st.lists(st.integers(0, num_slots - 1), max_size=num_slots, unique=True))
    generator = torch.Generator().manual_seed(len(slots))
    shape = (num_blocks, block_size, num_kv_heads, 8)
    k_cache = torch.randn(shape, generator=generator).to(cache_dtype)
    v_cache = torch.randn(shape, generator=generator).to(cache_dtype)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    key = torch.randn(len(slots), num_kv_heads, 8, generator=generator)
    value = torch.randn(len(slots), num_kv_heads, 8, generator=generator)

    TorchBackend().write_kv(key, value, k_cache, v_cache, torch.tensor(slots, dtype=torch.int64))

    expected_k, expected_v = k_before.clone(), v_before.clone()
    for token, slot in enumerate(slots):
        block, offset = divmod(slot, block_size)
        expected_k[block, offset] = key[token].to(cache_dtype)
        expected_v[block, offset] = value[token].to(cache_dtype)
    assert k_cache.dtype == v_cache.dtype == cache_dtype
    torch.testing.assert_close(k_cache, expected_k, rtol=0, atol=0)
    torch.testing.assert_close(v_cache, expected_v, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_receives_rms_norm_and_silu_and_mul(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(4, 16, generator=generator).to(dtype)
    weight = torch.randn(16, generator=generator).to(dtype)
    backend = TorchBackend()
    normed = torch.full_like(x, float("nan"))
    assert backend.rms_norm(x, weight, 1e-6, out=normed) is normed
    torch.testing.assert_close(normed, backend.rms_norm(x, weight, 1e-6), rtol=0, atol=0)
    activated = torch.full((4, 8), float("nan"), dtype=dtype)
    assert backend.silu_and_mul(x, out=activated) is activated
    torch.testing.assert_close(activated, backend.silu_and_mul(x), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_is_the_add_then_the_norm(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(3)
    x, residual = (torch.randn(5, 48, generator=generator).to(dtype) for _ in range(2))
    weight = torch.rand(48, generator=generator).to(dtype) + 0.5
    backend = TorchBackend()
    normed, summed = backend.add_rms_norm(x, residual, weight, 1e-6)
    assert summed.dtype == normed.dtype == dtype
    torch.testing.assert_close(summed, x + residual, rtol=0, atol=0)
    torch.testing.assert_close(normed, backend.rms_norm(x + residual, weight, 1e-6), rtol=0, atol=0)
