"""The q4 format (GGUF's Q4_1 in panels of 16 rows), its reference op and ``metrale::q4_mm``.

A block of 32 weights is ``d * q + m`` with ``q`` in ``[0, 15]`` and ``d``, ``m`` float16: each
weight is within ``d / 2`` of its block's grid, plus the float16 rounding of ``d`` and ``m``
(half an ulp, ``2**-11`` relative, each). The reference product is ``x̂ @ W.T`` with ``x̂`` the
two-digit activations (``|x̂ - x| <= s / 508``, ``s = max|x| / 127`` per row); the native op
sums the same integers in another order, so it differs from the reference by float32 rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from metrale_kernels import (
    TorchBackend,
    dequantize_q4,
    q4_linear,
    q4_shape_error,
    quantize_q4,
)
from metrale_kernels.cpu.backend import CpuBackend
from metrale_kernels.cpu.native import NativeOps
from metrale_kernels.reference.int8_matmul import two_digit_rows
from metrale_kernels.reference.q4_matmul import (
    block_scales,
    pack_ggml_q4_1,
    q4_logical_shape,
    unpack_q4,
)

HALF_ULP16 = 2.0**-11  # float16 rounding, relative (normal numbers)
TINY16 = 2.0**-25  # float16 rounding, absolute (subnormals)


def pack_by_docstring(q: torch.Tensor) -> torch.Tensor:
    """``q (rows, cols)`` into ``packed``, written out from the module docstring: byte ``i`` of
    group ``g`` of a panel's block holds panel row ``i // 4``'s feature ``4g + i % 4`` in its
    low nibble and feature ``16 + 4g + i % 4`` in its high nibble."""
    rows, cols = q.shape
    panels = q.reshape(rows // 16, 16, cols // 32, 32)
    packed = torch.empty(rows // 16, cols // 32, 256, dtype=torch.uint8)
    for g in range(4):
        for i in range(64):
            row, feature = i // 4, 4 * g + i % 4
            low, high = panels[:, row, :, feature], panels[:, row, :, feature + 16]
            packed[:, :, 64 * g + i] = low | (high << 4)
    return packed


def scales_by_docstring(d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``d``, ``m`` float16 ``(rows, cols / 32)`` into ``scales (panels, blocks, 2, 16)``."""
    rows, blocks = d.shape
    scales = torch.empty(rows // 16, blocks, 2, 16, dtype=torch.float16)
    for row in range(rows):
        scales[row // 16, :, 0, row % 16] = d[row]
        scales[row // 16, :, 1, row % 16] = m[row]
    return scales


def gguf_blocks(
    rows: int, cols: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random Q4_1 blocks as a GGUF holds them: ``q`` with a 0 and a 15 in every block (the
    block's minimum and maximum), ``d > 0`` and ``m`` float16. Returns ``(q, d, m)``."""
    q = torch.randint(0, 16, (rows, cols // 32, 32), generator=generator, dtype=torch.uint8)
    where = torch.rand(rows, cols // 32, 32, generator=generator).argsort(dim=-1)[..., :2]
    q.scatter_(-1, where[..., :1], 0)
    q.scatter_(-1, where[..., 1:], 15)
    d = (torch.rand(rows, cols // 32, generator=generator) * 0.1 + 1e-3).to(torch.float16)
    m = ((torch.rand(rows, cols // 32, generator=generator) - 0.5) * 2).to(torch.float16)
    return q.reshape(rows, cols), d, m


def random_weight(rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    """Gaussian rows around an offset of their own, so that the blocks' ``m`` terms matter."""
    offset = (torch.rand(rows, 1, generator=generator) - 0.5) * 0.4
    return torch.randn(rows, cols, generator=generator) * 0.05 + offset


# -- the format ---------------------------------------------------------------------------------


def test_a_ggufs_q4_1_blocks_move_into_the_layout_byte_for_byte() -> None:
    generator = torch.Generator().manual_seed(3)
    rows, cols = 48, 96
    q, d, m = gguf_blocks(rows, cols, generator)
    blocks = q.reshape(rows, cols // 32, 32)
    nibbles = blocks[..., :16] | (blocks[..., 16:] << 4)  # ggml: byte j holds j and j + 16
    packed, scales = pack_ggml_q4_1(nibbles, d, m)
    assert torch.equal(packed, pack_by_docstring(q))
    assert torch.equal(scales, scales_by_docstring(d, m))
    # The same bytes quantize_q4 finds from the blocks' values (each has its 0 and its 15).
    values = (blocks.to(torch.float32) * d.float()[..., None] + m.float()[..., None]).reshape(
        rows, cols
    )
    assert all(map(torch.equal, quantize_q4(values), (packed, scales)))


def test_q4_1_blocks_the_panels_cannot_tile_are_refused() -> None:
    nibbles = torch.zeros(24, 2, 16, dtype=torch.uint8)
    d = m = torch.zeros(24, 2, dtype=torch.float16)
    with pytest.raises(ValueError, match="multiples of 16"):
        pack_ggml_q4_1(nibbles, d, m)
    with pytest.raises(ValueError, match="one d and one m per block"):
        pack_ggml_q4_1(nibbles[:16], d, m)


def test_quantize_q4_is_within_half_a_step_of_each_block() -> None:
    generator = torch.Generator().manual_seed(0)
    rows, cols = 48, 160
    w = torch.randn(rows, cols, generator=generator) * torch.logspace(-3, 1, rows)[:, None]
    w[5] += 3.0  # a row far from zero: m large against d
    packed, scales = quantize_q4(w)
    assert packed.dtype == torch.uint8
    assert packed.shape == (3, 5, 256)
    assert scales.dtype == torch.float16
    assert scales.shape == (3, 5, 2, 16)
    assert q4_logical_shape(packed) == (rows, cols)
    assert int(unpack_q4(packed).max()) <= 15

    blocks = w.reshape(rows, cols // 32, 32)
    low, high = blocks.amin(-1), blocks.amax(-1)
    d, m = block_scales(scales)
    # m and d are the block's minimum and (max - min) / 15, rounded to float16.
    assert bool(((m - low).abs() <= HALF_ULP16 * low.abs() + TINY16).all())
    step = (high - low) / 15
    assert bool(((d - step).abs() <= HALF_ULP16 * step + TINY16).all())

    error = (dequantize_q4(packed, scales) - w).abs().reshape(rows, cols // 32, 32)
    slack = HALF_ULP16 * (m.abs() + 15 * d) + TINY16 + 2**-22 * blocks.abs().amax(-1)
    assert bool((error <= (d / 2 + slack).unsqueeze(-1)).all())
    # The bound is met, not just kept: a block's worst weight is near half a step away.
    worst = error.amax(-1) / d
    assert float(worst.median()) > 0.4


def test_quantize_q4_keeps_the_blocks_of_a_gguf_bit_for_bit() -> None:
    generator = torch.Generator().manual_seed(1)
    # From a float matrix: its blocks, dequantized and quantized again.
    packed, scales = quantize_q4(random_weight(64, 256, generator))
    again_packed, again_scales = quantize_q4(dequantize_q4(packed, scales))
    assert torch.equal(again_packed, packed)
    assert torch.equal(again_scales.view(torch.int16), scales.view(torch.int16))
    # Arbitrary Q4_1 blocks (a 0 and a 15 in each), packed by hand.
    q, d, m = gguf_blocks(32, 192, generator)
    packed, scales = pack_by_docstring(q), scales_by_docstring(d, m)
    again_packed, again_scales = quantize_q4(dequantize_q4(packed, scales))
    assert torch.equal(unpack_q4(again_packed), q)
    assert torch.equal(again_packed, packed)
    assert torch.equal(again_scales.view(torch.int16), scales.view(torch.int16))


def test_the_layout_is_the_documented_one() -> None:
    generator = torch.Generator().manual_seed(2)
    rows, cols = 32, 64
    q, _, _ = gguf_blocks(rows, cols, generator)  # a 0 and a 15 in each block: q comes back
    row, block = torch.arange(rows)[:, None], torch.arange(cols // 32)[None, :]
    d = ((1 + row + 3 * block) / 8).to(torch.float16)  # exact in float16 and float32
    m = ((row - 5 * block) / 4).to(torch.float16)
    w = q.reshape(rows, cols // 32, 32) * d.float().unsqueeze(-1) + m.float().unsqueeze(-1)

    packed, scales = quantize_q4(w.reshape(rows, cols))

    assert torch.equal(unpack_q4(packed), q)
    assert torch.equal(packed, pack_by_docstring(q))
    assert torch.equal(scales, scales_by_docstring(d, m))
    got_d, got_m = block_scales(scales)
    assert torch.equal(got_d, d.float())
    assert torch.equal(got_m, m.float())

    def byte(row: int, low_feature: int) -> int:
        return int(q[row, low_feature]) | (int(q[row, low_feature + 16]) << 4)

    # A few bytes by hand: (panel, block, byte) holds (row, feature) and (row, feature + 16).
    assert int(packed[0, 0, 0]) == byte(0, 0)
    assert int(packed[0, 0, 3]) == byte(0, 3)
    assert int(packed[0, 0, 5]) == byte(1, 1)  # value 5 of quad 0: row 1, feature 1
    assert int(packed[0, 0, 63]) == byte(15, 3)
    assert int(packed[0, 0, 64]) == byte(0, 4)  # group 1: quads 1 and 5
    assert int(packed[0, 1, 130]) == byte(0, 32 + 8 + 2)  # block 1, group 2, value 2
    assert int(packed[1, 1, 255]) == byte(31, 32 + 12 + 3)
    assert float(scales[1, 0, 0, 2]) == float(d[18, 0])
    assert float(scales[1, 1, 1, 15]) == float(m[31, 1])


def test_a_constant_block_gets_no_step() -> None:
    w = torch.randn(16, 96)
    w[3, 32:64] = 0.7
    w[9, :32] = 0.0
    packed, scales = quantize_q4(w)
    d, m = block_scales(scales)
    q = unpack_q4(packed)
    assert float(d[3, 1]) == 0.0
    assert float(m[3, 1]) == float(torch.tensor(0.7).half())
    assert float(d[9, 0]) == 0.0
    assert float(m[9, 0]) == 0.0
    assert bool((q[3, 32:64] == 0).all())
    assert bool((q[9, :32] == 0).all())
    deq = dequantize_q4(packed, scales)
    assert bool((deq[3, 32:64] == float(torch.tensor(0.7).half())).all())
    assert bool((deq[9, :32] == 0).all())
    assert float(d[3, 0]) > 0
    assert float(d[3, 2]) > 0


@pytest.mark.parametrize(("rows", "cols"), [(17, 32), (16, 48), (8, 64), (0, 31), (40, 40)])
def test_shapes_off_the_panels_and_blocks_are_refused(rows: int, cols: int) -> None:
    error = q4_shape_error(rows, cols)
    assert error is not None
    assert f"({rows}, {cols})" in error
    assert "multiples of 16" in error
    assert "multiples of 32" in error
    with pytest.raises(ValueError, match="q4 weights need"):
        quantize_q4(torch.randn(rows, cols))


@pytest.mark.parametrize(("rows", "cols"), [(16, 32), (48, 96), (960, 576), (0, 64)])
def test_shapes_on_the_panels_and_blocks_are_taken(rows: int, cols: int) -> None:
    assert q4_shape_error(rows, cols) is None
    packed, scales = quantize_q4(torch.randn(rows, cols))
    assert dequantize_q4(packed, scales).shape == (rows, cols)


# -- the reference op ---------------------------------------------------------------------------


def two_digit_x(x: torch.Tensor) -> torch.Tensor:
    """``x̂ = s * (d1 + d2 / 254)`` in float64."""
    digits, scale = two_digit_rows(x)
    first, second = digits.double().chunk(2)
    return scale.double()[:, None] * (first + second / 254)


@pytest.mark.parametrize(("tokens", "rows", "cols"), [(1, 16, 32), (5, 48, 96), (9, 960, 576)])
def test_q4_linear_is_the_two_digit_activations_times_the_blocks(
    tokens: int, rows: int, cols: int
) -> None:
    generator = torch.Generator().manual_seed(tokens)
    packed, scales = quantize_q4(random_weight(rows, cols, generator))
    x = torch.randn(tokens, cols, generator=generator)
    x[:, 3] *= 20  # an outlier channel sets each row's digit scale
    deq = dequantize_q4(packed, scales).double()
    scale = float((x.abs().double() @ deq.abs().T).amax())

    got = q4_linear(x, packed, scales)

    assert got.dtype == torch.float32
    assert got.shape == (tokens, rows)
    # x̂ @ W.T, float32 summation aside.
    want = two_digit_x(x) @ deq.T
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6 * scale)
    # And x @ W.T within the digits' error: |x̂ - x| <= s / 508 per element.
    _, digit_scale = two_digit_rows(x)
    bound = digit_scale.double()[:, None] / 508 * deq.abs().sum(-1) + 1e-6 * scale
    error = (got.double() - x.double() @ deq.T).abs()
    assert bool((error <= bound).all())
    assert float(error.max()) > 0  # the digits are not x itself: the bound is at work


def test_q4_linear_adds_the_bias_writes_out_and_takes_no_tokens() -> None:
    generator = torch.Generator().manual_seed(3)
    packed, scales = quantize_q4(random_weight(48, 96, generator))
    x = torch.randn(4, 96, generator=generator)
    bias = torch.randn(48, generator=generator)
    plain = q4_linear(x, packed, scales)
    assert torch.equal(q4_linear(x, packed, scales, bias), plain + bias)

    out = torch.full((4, 48), float("nan"))
    result = TorchBackend().q4_linear(x, packed, scales, bias, out=out)
    assert result is out
    assert torch.equal(out, plain + bias)

    assert q4_linear(torch.randn(0, 96), packed, scales).shape == (0, 48)
    empty_out = torch.empty(0, 48)
    assert q4_linear(torch.randn(0, 96), packed, scales, bias, out=empty_out) is empty_out
    with pytest.raises(ValueError, match="x has 64 features, the matrix 96"):
        q4_linear(torch.randn(2, 64), packed, scales)


def test_q4_linear_returns_the_activations_dtype() -> None:
    generator = torch.Generator().manual_seed(4)
    packed, scales = quantize_q4(random_weight(32, 64, generator))
    x = torch.randn(3, 64, generator=generator).to(torch.bfloat16)
    bias = torch.randn(32, generator=generator)
    got = q4_linear(x, packed, scales, bias)
    assert got.dtype == torch.bfloat16
    want = q4_linear(x.float(), packed, scales, bias).to(torch.bfloat16)  # only the last rounding
    assert torch.equal(got, want)


# -- the native op ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def native(native_ops: NativeOps) -> None:
    del native_ops  # built and loaded: torch.ops.metrale.q4_mm is there


def close_to_reference(got: torch.Tensor, want: torch.Tensor, scale: float) -> None:
    """Float32 summation order only."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("tokens", [1, 2, 3, 7, 8, 9, 16, 33, 64])
@pytest.mark.parametrize("rows", [16, 48, 960])
@pytest.mark.parametrize("cols", [32, 96, 576, 1536])
def test_q4_mm_matches_the_reference(native: None, tokens: int, rows: int, cols: int) -> None:
    del native
    generator = torch.Generator().manual_seed(tokens * 10_000 + rows + cols)
    packed, scales = quantize_q4(random_weight(rows, cols, generator))
    x = torch.randn(tokens, cols, generator=generator)
    x[:, 1] *= 10  # an outlier channel
    bias = torch.randn(rows, generator=generator)
    scale = float((x.abs() @ dequantize_q4(packed, scales).abs().T).amax())

    plain = torch.ops.metrale.q4_mm(x, packed, scales, None)
    biased = torch.ops.metrale.q4_mm(x, packed, scales, bias)

    assert plain.dtype == torch.float32
    assert plain.shape == (tokens, rows)
    close_to_reference(plain, q4_linear(x, packed, scales), scale)
    close_to_reference(biased, q4_linear(x, packed, scales, bias), scale)


@pytest.mark.parametrize("tokens", [2, 3, 8, 9, 17, 64])
def test_q4_mm_gives_a_row_the_same_bits_alone_and_in_any_batch(native: None, tokens: int) -> None:
    del native
    generator = torch.Generator().manual_seed(tokens)
    packed, scales = quantize_q4(random_weight(48, 576, generator))
    x = torch.randn(tokens, 576, generator=generator)
    bias = torch.randn(48, generator=generator)
    batch = torch.ops.metrale.q4_mm(x, packed, scales, bias)
    for i in range(tokens):
        alone = torch.ops.metrale.q4_mm(x[i : i + 1], packed, scales, bias)
        assert torch.equal(alone[0], batch[i]), i
    middle = torch.ops.metrale.q4_mm(x[1:-1], packed, scales, bias)  # another tiling
    assert torch.equal(middle, batch[1:-1])


# q4_mm passes over the rows in chunks of about 192 KiB of digits (2 * k bytes a row), a whole
# number of the path's row tiles: at k = 1536, 64 rows on every path. Mirrored here only to put
# rows on both sides of chunk boundaries; a 2048-row call spans many chunks whatever it is.
CHUNK_DIGIT_BYTES = 192 * 1024
TILE_ROWS = {"avx512_vnni": 8, "avx2": 4, "scalar": 1}
CHUNKED_K = 1536


def chunk_rows(k: int) -> int:
    tile = TILE_ROWS[str(torch.ops.metrale.q4_mm_path())]
    return max(1, CHUNK_DIGIT_BYTES // (2 * k) // tile) * tile


def chunked_operands(
    tokens: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, packed, scales, bias)`` at ``CHUNKED_K`` features: 10 panels of 16 output rows
    (more than one task's grain of panels) and ``tokens`` distinct activation rows."""
    generator = torch.Generator().manual_seed(seed)
    packed, scales = quantize_q4(random_weight(160, CHUNKED_K, generator))
    x = torch.randn(tokens, CHUNKED_K, generator=generator)
    x[:, 5] *= 10  # an outlier channel
    bias = torch.randn(160, generator=generator)
    return x, packed, scales, bias


@pytest.mark.parametrize(
    "tokens_of_chunk",
    [lambda chunk: 65, lambda chunk: 2 * chunk + 3, lambda chunk: 2048],
    ids=["65", "2chunks+3", "2048"],
)
def test_q4_mm_matches_the_reference_in_every_chunk_of_rows(
    native: None, tokens_of_chunk: Callable[[int], int]
) -> None:
    del native
    tokens = tokens_of_chunk(chunk_rows(CHUNKED_K))
    assert tokens > chunk_rows(CHUNKED_K)  # more than one chunk
    x, packed, scales, bias = chunked_operands(tokens, seed=tokens)
    scale = float((x.abs() @ dequantize_q4(packed, scales).abs().T).amax())

    got = torch.ops.metrale.q4_mm(x, packed, scales, bias)

    assert got.shape == (tokens, 160)
    close_to_reference(got, q4_linear(x, packed, scales, bias), scale)


def test_q4_mm_gives_a_row_the_same_bits_alone_and_across_chunk_boundaries(native: None) -> None:
    del native
    chunk = chunk_rows(CHUNKED_K)
    tokens = 3 * chunk + 5
    x, packed, scales, bias = chunked_operands(tokens, seed=11)
    batch = torch.ops.metrale.q4_mm(x, packed, scales, bias)
    edges = [0, chunk - 1, chunk, chunk + 1, 2 * chunk, 3 * chunk - 1, 3 * chunk, tokens - 1]
    for i in edges:
        alone = torch.ops.metrale.q4_mm(x[i : i + 1], packed, scales, bias)
        assert torch.equal(alone[0], batch[i]), i
    # Starting mid-chunk, every row falls in another chunk and tile than in the batch.
    start = chunk // 2 + 1
    shifted = torch.ops.metrale.q4_mm(x[start:], packed, scales, bias)
    assert torch.equal(shifted, batch[start:])


def test_q4_mm_gives_a_zero_row_its_bias(native: None) -> None:
    del native
    generator = torch.Generator().manual_seed(5)
    packed, scales = quantize_q4(random_weight(32, 96, generator))
    x = torch.randn(10, 96, generator=generator)
    x[[0, 4, 9]] = 0
    bias = torch.randn(32, generator=generator)
    got = torch.ops.metrale.q4_mm(x, packed, scales, bias)
    for row in (0, 4, 9):
        assert torch.equal(got[row], bias)
    assert torch.ops.metrale.q4_mm(torch.zeros(0, 96), packed, scales, bias).shape == (0, 32)


def test_the_cpu_backend_runs_q4_mm_after_prepare(native: None) -> None:
    del native
    generator = torch.Generator().manual_seed(6)
    packed, scales = quantize_q4(random_weight(960, 576, generator))
    x = torch.randn(5, 576, generator=generator)
    bias = torch.randn(960, generator=generator)
    cpu = CpuBackend()
    cpu.prepare()
    assert cpu.native is not None
    assert cpu.native.q4_path in {"avx512_vnni", "avx2", "scalar"}
    assert cpu.native.q4_path == torch.ops.metrale.q4_mm_path()
    assert f"q4_mm ({cpu.native.q4_path})" in cpu.describe()

    got = cpu.q4_linear(x, packed, scales, bias)

    assert torch.equal(got, torch.ops.metrale.q4_mm(x, packed, scales, bias))
    scale = float((x.abs() @ dequantize_q4(packed, scales).abs().T).amax())
    close_to_reference(got, TorchBackend().q4_linear(x, packed, scales, bias), scale)
    out = torch.full((5, 960), float("nan"))
    assert cpu.q4_linear(x, packed, scales, bias, out=out) is out
    assert torch.equal(out, got)
    # A transposed (non-contiguous) x is made contiguous first.
    x_t = torch.randn(576, 5, generator=generator).t()
    assert torch.equal(
        cpu.q4_linear(x_t, packed, scales), cpu.q4_linear(x_t.contiguous(), packed, scales)
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_the_cpu_backend_takes_the_reference_for_other_dtypes(
    native: None, dtype: torch.dtype
) -> None:
    del native
    generator = torch.Generator().manual_seed(7)
    packed, scales = quantize_q4(random_weight(48, 96, generator))
    x = torch.randn(3, 96, generator=generator).to(dtype)
    got = CpuBackend().q4_linear(x, packed, scales)
    assert got.dtype == dtype
    assert torch.equal(got, TorchBackend().q4_linear(x, packed, scales))


def test_q4_mm_refuses_what_it_cannot_multiply(native: None) -> None:
    del native
    packed, scales = quantize_q4(torch.randn(32, 96))
    x = torch.randn(2, 96)
    with pytest.raises(
        RuntimeError, match=r"packed uint8 \(out / 16, in / 32, 256\) contiguous with in = 64"
    ):
        torch.ops.metrale.q4_mm(torch.randn(2, 64), packed, scales, None)
    with pytest.raises(RuntimeError, match=r"float16 scales \(out / 16, in / 32, 2, 16\)"):
        torch.ops.metrale.q4_mm(x, packed, scales.float(), None)
    with pytest.raises(RuntimeError, match=r"float16 scales"):
        torch.ops.metrale.q4_mm(x, packed, scales[:1].contiguous(), None)
    with pytest.raises(RuntimeError, match="a float32 bias per output row"):
        torch.ops.metrale.q4_mm(x, packed, scales, torch.zeros(16))
    with pytest.raises(RuntimeError, match=r"q4_mm: float32 \(tokens, features\) activations"):
        torch.ops.metrale.q4_mm(x.double(), packed, scales, None)
    with pytest.raises(RuntimeError, match="contiguous"):
        torch.ops.metrale.q4_mm(x, packed.transpose(0, 1), scales, None)


# Each activation's digits are written with the step ``127 / amax`` rounded once, by the
# kernel and the reference alike (``127 / tensor`` in torch rounds twice: a quarter of the rows
# would get a step one ulp apart). Here ``x = [1.125, 0.28125, 0...]``: 0.28125 is 31.75 steps,
# second digit -63.5 steps of ``s / 254``, a tie on which the two steps round apart.
def test_q4_mm_writes_the_references_digits(native: None) -> None:
    del native
    packed, scales = quantize_q4(torch.eye(16, 32))  # y[:, n] = x̂[:, n] * 15 * d, d = 1/15
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 1.125, 0.28125
    got = torch.ops.metrale.q4_mm(x, packed, scales, None)
    want = q4_linear(x, packed, scales)
    # One digit of s / 254 is 3.5e-5 here; float32 rounding a few 1e-8.
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
