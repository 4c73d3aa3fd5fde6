"""Quantized K/V caches (int8, fp8 e4m3 and e5m2 rows with a float16 scale each).

The reference quantizes within each format's rounding, attends over a quantized cache exactly
as over its dequantized float copy, and the native CPU kernel gives the reference's attention
(float32 rounding apart) and the same bits for a row alone as in any batch.
"""

from __future__ import annotations

import pytest
import torch

from metrale_kernels import TorchBackend, build_attention_metadata
from metrale_kernels.cpu.backend import CpuBackend
from metrale_kernels.cpu.native import NativeOps
from metrale_kernels.reference.kv_quantization import (
    QMAX,
    SCALE_BYTES,
    cache_head_dim,
    dequantize_kv,
    quantize_kv,
)
from metrale_kernels.testing.paged_batches import batch_invariance, paged_batch

KV_DTYPES = list(QMAX)
# The largest error of one stored value, relative to its row's amax: int8 rounds to half a
# step of amax/127; fp8 keeps 3 (e4m3) or 2 (e5m2) mantissa bits, half an ulp relative to the
# value itself, and the float16 scale adds its own rounding.
ROW_ERROR = {
    torch.int8: 0.5 / 127 + 1e-3,
    torch.float8_e4m3fn: 2**-4 + 1e-3,
    torch.float8_e5m2: 2**-3 + 1e-3,
}
CASES = [([1], [1]), ([17, 3, 40], [1, 1, 1]), ([30, 9], [30, 4]), ([64, 5, 33], [1, 5, 10])]


@pytest.fixture(scope="module")
def backend(native_ops: NativeOps) -> CpuBackend:
    del native_ops
    cpu = CpuBackend()
    assert cpu.native is not None
    return cpu


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_rows_round_trip_within_the_formats_rounding(kv_dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(50, 4, 64, generator=generator) * torch.logspace(-2, 3, 50)[:, None, None]
    rows = quantize_kv(x, kv_dtype)
    assert rows.dtype == kv_dtype
    assert rows.shape == (50, 4, 64 + SCALE_BYTES)
    assert cache_head_dim(rows) == 64
    amax = x.abs().amax(-1, keepdim=True)
    error = (dequantize_kv(rows) - x).abs()
    assert (error <= ROW_ERROR[kv_dtype] * amax).all()
    # The scale maps each row's amax to the format's largest value: nothing is clipped.
    assert (dequantize_kv(rows).abs().amax(-1, keepdim=True) >= amax * 0.9).all()


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_a_zero_row_stays_zero(kv_dtype: torch.dtype) -> None:
    rows = quantize_kv(torch.zeros(3, 2, 16), kv_dtype)
    assert torch.equal(dequantize_kv(rows), torch.zeros(3, 2, 16))


@pytest.mark.parametrize(("seq_lens", "query_lens"), CASES)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("sliding_window", [None, 6])
def test_reference_attends_a_quantized_cache_as_its_dequantized_copy(
    seq_lens: list[int], query_lens: list[int], kv_dtype: torch.dtype, sliding_window: int | None
) -> None:
    batch = paged_batch(
        seq_lens=seq_lens,
        query_lens=query_lens,
        num_heads=6,
        num_kv_heads=2,
        head_dim=32,
        dtype=torch.float32,
        device=torch.device("cpu"),
        block_size=5,
        kv_dtype=kv_dtype,
    )
    dequantized = [dequantize_kv(cache) for cache in (batch.k_cache, batch.v_cache)]
    reference = TorchBackend()
    got = reference.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.metadata, 0.25, sliding_window
    )
    want = reference.paged_attention(batch.q, *dequantized, batch.metadata, 0.25, sliding_window)
    assert not got.isnan().any()
    assert torch.equal(got, want)


@pytest.mark.parametrize(("seq_lens", "query_lens"), CASES)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 2)])
@pytest.mark.parametrize("sliding_window", [None, 6])
def test_native_attention_over_a_quantized_cache_matches_the_reference(
    backend: CpuBackend,
    seq_lens: list[int],
    query_lens: list[int],
    kv_dtype: torch.dtype,
    num_heads: int,
    num_kv_heads: int,
    sliding_window: int | None,
) -> None:
    batch = paged_batch(
        seq_lens=seq_lens,
        query_lens=query_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=32,
        dtype=torch.float32,
        device=torch.device("cpu"),
        block_size=5,
        seed=sum(seq_lens),
        kv_dtype=kv_dtype,
    )
    args = (batch.q, batch.k_cache, batch.v_cache, batch.metadata, 0.25, sliding_window)
    got = backend.paged_attention(*args)
    assert not got.isnan().any()
    torch.testing.assert_close(got, TorchBackend().paged_attention(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn])
def test_native_rows_over_a_quantized_cache_are_batch_invariant(
    backend: CpuBackend, kv_dtype: torch.dtype
) -> None:
    assert batch_invariance(
        backend, torch.float32, torch.device("cpu"), num_others=(7,), kv_dtype=kv_dtype
    )


def test_a_cache_of_another_head_dim_is_refused() -> None:
    batch = paged_batch(
        seq_lens=[4],
        query_lens=[4],
        num_heads=2,
        num_kv_heads=2,
        head_dim=16,
        dtype=torch.float32,
        device=torch.device("cpu"),
        kv_dtype=torch.int8,
    )
    with pytest.raises(ValueError, match="holds head dim 16, the query's is 18"):
        TorchBackend().paged_attention(
            torch.zeros(4, 2, 18), batch.k_cache, batch.v_cache, batch.metadata, 0.25
        )


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_native_attention_decodes_every_fp8_code_as_torch_does(
    backend: CpuBackend, kv_dtype: torch.dtype
) -> None:
    """One key: attention returns its value row, so every code (NaN codes aside) must come back
    as torch's cast of it, through the vector loop and the tail."""
    codes = torch.arange(256, dtype=torch.uint8)
    values = codes.view(kv_dtype).to(torch.float32)
    codes = codes[~values.isnan()]
    dim = codes.numel()  # not a multiple of 8 or 16: the tail runs too
    one = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    row = torch.cat((codes, one)).view(kv_dtype)
    k_cache = torch.cat((torch.zeros(dim, dtype=torch.uint8), one)).view(kv_dtype)
    shape = (1, 1, 1, dim + SCALE_BYTES)
    metadata = build_attention_metadata(
        block_tables=[[0]], seq_lens=[1], query_lens=[1], block_size=1
    )
    out = backend.paged_attention(
        torch.ones(1, 1, dim), k_cache.reshape(shape), row.reshape(shape), metadata, 1.0
    )
    assert torch.equal(out.flatten(), codes.view(kv_dtype).to(torch.float32))
