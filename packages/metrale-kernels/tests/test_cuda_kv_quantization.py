"""The CUDA kernels' quantized K/V arithmetic (``kernels/kv_quantization.cuh``), compiled for
the host and checked against the torch reference on the CPU: the same bytes for every row and
every fp8 rounding case, and each stored byte read back as torch reads it. (The kernels around
it need a GPU: the parity cases of ``testing/parity.py``.)"""

from __future__ import annotations

import ctypes
import subprocess
from importlib import resources
from pathlib import Path

import numpy
import pytest
import torch

from metrale_kernels.cpu.build import compiler
from metrale_kernels.cpu.native import NativeBuildError
from metrale_kernels.reference.kv_quantization import (
    QMAX,
    SCALE_BYTES,
    gather_blocks,
    quantize_kv,
)
from metrale_kernels.testing.paged_batches import paged_batch

FORMATS = {torch.int8: 0, torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}

# The device intrinsics the header uses, as their host equivalents (IEEE float32, round to
# nearest even; ``_Float16`` for the float16 conversions).
_HARNESS = r"""
#include <cmath>
#include <cstring>
#define __device__
#define __forceinline__ inline
struct half_t { unsigned short bits; };
static inline float to_float(half_t h) { _Float16 f; std::memcpy(&f, &h.bits, 2); return (float)f; }
template <typename T> T from_float(float x);
template <> inline half_t from_float<half_t>(float x) {
    _Float16 f = (_Float16)x; half_t h; std::memcpy(&h.bits, &f, 2); return h;
}
template <typename To, typename From>
static inline To bits_as(From x) { To y; std::memcpy(&y, &x, 4); return y; }
static inline unsigned int __float_as_uint(float x) { return bits_as<unsigned int>(x); }
static inline float __uint_as_float(unsigned int u) { return bits_as<float>(u); }
static inline float __int_as_float(int i) { return bits_as<float>(i); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
#include "kv_quantization.cuh"

template <typename F>
static void rows(const float* x, long num_rows, int dim, unsigned char* out) {
    for (long r = 0; r < num_rows; ++r) {
        const float* src = x + r * dim;
        unsigned char* dst = out + r * (dim + KV_SCALE_BYTES);
        float amax = 0.0f;
        for (int d = 0; d < dim; ++d) amax = fmaxf(amax, fabsf(src[d]));
        const half_t scale = kv_row_scale<F>(amax);
        for (int d = 0; d < dim; ++d) dst[d] = kv_quantize<F>(src[d], scale);
        dst[dim] = scale.bits & 0xff;
        dst[dim + 1] = scale.bits >> 8;
    }
}

template <typename F>
static void encode(const float* x, long n, unsigned char* out) {
    for (long i = 0; i < n; ++i) out[i] = F::encode(x[i]);
}

template <typename F>
static void decode(float* out, const unsigned char* rows, int dim) {
    for (int b = 0; b < 256; ++b) out[b] = F::decode(b);
    out[256] = kv_scale_of(rows, dim);
}

extern "C" void quantize_rows(int format, const float* x, long num_rows, int dim,
                              unsigned char* out) {
    if (format == 0) rows<KvInt8>(x, num_rows, dim, out);
    else if (format == 1) rows<KvFp8E4m3>(x, num_rows, dim, out);
    else rows<KvFp8E5m2>(x, num_rows, dim, out);
}

extern "C" void encode_values(int format, const float* x, long n, unsigned char* out) {
    if (format == 0) encode<KvInt8>(x, n, out);
    else if (format == 1) encode<KvFp8E4m3>(x, n, out);
    else encode<KvFp8E5m2>(x, n, out);
}

// Each byte's value (256 floats), then the scale of ``row`` (one float).
extern "C" void decode_values(int format, float* out, const unsigned char* row, int dim) {
    if (format == 0) decode<KvInt8>(out, row, dim);
    else if (format == 1) decode<KvFp8E4m3>(out, row, dim);
    else decode<KvFp8E5m2>(out, row, dim);
}
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    try:
        cxx = compiler()
    except NativeBuildError as error:
        pytest.skip(f"compiling the header for the host needs a C++ compiler: {error}")
    scratch = tmp_path_factory.mktemp("kv_quantization")
    header = resources.files("metrale_kernels.cuda").joinpath("kernels", "kv_quantization.cuh")
    (scratch / "kv_quantization.cuh").write_text(header.read_text())
    (scratch / "harness.cpp").write_text(_HARNESS)
    library = scratch / "harness.so"
    done = subprocess.run(
        [cxx, "-std=c++17", "-O2", "-ffp-contract=off", "-fPIC", "-shared", "-o", str(library),
         str(scratch / "harness.cpp")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return _bind(library)


def _bind(library: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library))
    pointer, long_, int_ = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    lib.quantize_rows.argtypes = [int_, pointer, long_, int_, pointer]
    lib.encode_values.argtypes = [int_, pointer, long_, pointer]
    lib.decode_values.argtypes = [int_, pointer, pointer, int_]
    return lib


def _quantize_rows(host: ctypes.CDLL, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    x = x.to(torch.float32).contiguous()
    num_rows, dim = x.reshape(-1, x.shape[-1]).shape
    out = torch.empty(num_rows, dim + SCALE_BYTES, dtype=torch.uint8)
    host.quantize_rows(FORMATS[dtype], x.data_ptr(), num_rows, dim, out.data_ptr())
    return out


def _rows(dtype: torch.dtype) -> torch.Tensor:
    """Random rows over 13 decades, a zero row, rows whose scale is a float16 subnormal or
    rounds to zero, and rows of exact rounding ties (at a power-of-two scale)."""
    generator = torch.Generator().manual_seed(3)
    spread = torch.logspace(-9, 4, 60)[:, None]
    x = torch.randn(60, 64, generator=generator) * spread
    qmax = QMAX[dtype]
    scale = 2.0**-6
    if dtype == torch.int8:
        ties = [0.5, 1.5, 2.5, -0.5, -2.5, 126.5, 3.5]
    elif dtype == torch.float8_e4m3fn:  # 3 mantissa bits: halfway cases, normal and subnormal
        ties = [1.0625, 1.1875, -1.0625, 3 * 2.0**-10, 5 * 2.0**-10, 2.0**-10, 432.0, 400.0]
    else:  # 2 mantissa bits
        ties = [1.125, 1.375, -1.125, 3 * 2.0**-17, 2.0**-17, 288.0, 416.0, 352.0]
    tie_row = torch.zeros(64)
    tie_row[0] = qmax
    tie_row[1 : 1 + len(ties)] = torch.tensor(ties)
    special = torch.stack([
        torch.zeros(64),
        torch.full((64,), 1e-9),  # amax / QMAX rounds to a zero float16 scale: divisor 1
        torch.linspace(-3e-5, 3e-5, 64),  # a subnormal float16 scale
        tie_row * scale,
        -tie_row * scale,
        torch.full((64,), 6e4),
        # amax / 448 and amax * (1 / 448) round to different float16 scales (torch on CUDA
        # divides by a scalar so; the CPU reference divides).
        torch.linspace(-12.29443359375, 12.0, 64),
    ])  # fmt: skip
    return torch.cat([x, special])


@pytest.mark.parametrize("dtype", list(FORMATS), ids=lambda d: str(d).removeprefix("torch."))
def test_rows_are_the_references_bytes(host: ctypes.CDLL, dtype: torch.dtype) -> None:
    x = _rows(dtype)
    want = quantize_kv(x, dtype).view(torch.uint8)
    got = _quantize_rows(host, x, dtype)
    assert torch.equal(got, want), (got != want).nonzero()[:10].tolist()
    # An input the kernels take in half precision, converted to float32 exactly.
    for half in (torch.float16, torch.bfloat16):
        rounded = x.clamp(-6e4, 6e4).to(half)
        want = quantize_kv(rounded, dtype).view(torch.uint8)
        assert torch.equal(_quantize_rows(host, rounded, dtype), want), half


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_rounding_matches_torch_for_every_256th_float_below_448(
    host: ctypes.CDLL, dtype: torch.dtype
) -> None:
    # Every float32 whose low 8 bits are 0, from 0 to 448, and their negatives: each fp8
    # rounding boundary and tie (e4m3 drops 20 bits, e5m2 21), subnormals included.
    bits = numpy.arange(0, 0x43E00000 + 1, 256, dtype=numpy.uint32)
    x = torch.from_numpy(numpy.concatenate([bits, bits | 0x80000000]).view(numpy.float32))
    got = torch.empty(len(x), dtype=torch.uint8)
    host.encode_values(FORMATS[dtype], x.data_ptr(), len(x), got.data_ptr())
    want = x.to(dtype).view(torch.uint8)
    assert torch.equal(got, want), x[got != want][:10].tolist()


@pytest.mark.parametrize("dtype", list(FORMATS), ids=lambda d: str(d).removeprefix("torch."))
def test_every_byte_reads_back_as_torch_reads_it(host: ctypes.CDLL, dtype: torch.dtype) -> None:
    row = quantize_kv(torch.linspace(-3.0, 2.0, 10), dtype).view(torch.uint8)
    out = torch.empty(257, dtype=torch.float32)
    host.decode_values(FORMATS[dtype], out.data_ptr(), row.data_ptr(), 10)
    want = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    torch.testing.assert_close(out[:256], want, rtol=0, atol=0, equal_nan=True)
    assert out[256] == row[10:].view(torch.float16).float()


@pytest.mark.parametrize("dtype", list(FORMATS), ids=lambda d: str(d).removeprefix("torch."))
def test_the_kernels_row_offsets_address_the_references_rows(dtype: torch.dtype) -> None:
    # The quantized load_tile's index math, over the flat bytes of a cache the reference
    # wrote: row (slot * kv_heads + kv_head) * (head_dim + 2), value pairs at 2c, the scale's
    # little-endian bytes at head_dim.
    head_dim, num_kv_heads, block_size = 34, 3, 16
    batch = paged_batch(
        seq_lens=[70, 5], query_lens=[1, 1], num_heads=6, num_kv_heads=num_kv_heads,
        head_dim=head_dim, dtype=torch.bfloat16, device=torch.device("cpu"), kv_dtype=dtype,
    )  # fmt: skip
    flat = batch.k_cache.view(torch.uint8).flatten().long()
    row_bytes = head_dim + SCALE_BYTES
    table = batch.metadata.block_tables[0]
    key = torch.arange(70)[:, None, None]
    kv_head = torch.arange(num_kv_heads)[None, :, None]
    pair = torch.arange(head_dim // 2)[None, None, :]
    slot = table[key // block_size] * block_size + key % block_size
    row = (slot * num_kv_heads + kv_head) * row_bytes
    two = flat[row + 2 * pair] | (flat[row + 2 * pair + 1] << 8)
    scale_bits = flat[row[..., :1] + head_dim] | (flat[row[..., :1] + head_dim + 1] << 8)
    scale = scale_bits.to(torch.int16).view(torch.float16).float()
    values = torch.stack([two & 0xFF, two >> 8], -1).flatten(-2).to(torch.uint8)
    got = values.view(dtype).float() * scale
    want = gather_blocks(batch.k_cache, table[:5]).flatten(0, 1)[:70]
    torch.testing.assert_close(got, want, rtol=0, atol=0)
