"""Float matmuls whose rows do not depend on the other rows of the call (row invariance).

A BLAS GEMM computes an output row with the micro-kernel of the row tile it falls in: rows of a
full tile one way, the leftover rows of a call (and a lone row: GEMV) another, so a token's
result changes with how many rows share its step (measured with torch's float32 ``mm`` on an
AVX2 CPU: a row alone, and the last ``M % 4`` rows, differ from the same row among 200 in the
last bits). Padding every call to whole tiles with zero rows puts each row in a full tile,
computed the same way whatever else is in the call. The tile is probed on this machine at run
time (:func:`matmul_row_tile`), since machines of one class differ in their kernels. A longer
call runs as calls of at most ``MAX_CALL_ROWS`` rows, so the kernels only ever see the row
counts the probe tried: oneDNN's bf16 GEMMs on a CPU with AMX pick another kernel as the rows
grow (measured: tile 32 broke at 33 rows, tile 64 at 2048).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch

# Tiles tried, smallest first; a padded call costs at most tile - 1 extra rows.
CANDIDATE_TILES = (4, 8, 16, 32, 64)
# Rows of one matmul call at most (a multiple of every candidate tile).
MAX_CALL_ROWS = 256
# Where no tile keeps calls of up to MAX_CALL_ROWS rows invariant, calls of exactly one of these
# tiles each (fewer rows a call cost prefill speed, so not the smallest).
SPLIT_TILES = (32, 64)
# (in, out) shapes probed: small and large reductions, both weight layouts.
_PROBE_SHAPES = ((64, 96), (512, 1024))
_PROBE_ROWS = (1, 2, 3, 5, 7, 9, 13, 33, 65, 129, 200, MAX_CALL_ROWS)
# Elementwise ops run on whole multiples of this many elements (two AVX-512 float vectors, four
# AVX2 ones): :func:`pointwise_rows`.
POINTWISE_ELEMENTS = 64


def padded_rows(num_rows: int, tile: int) -> int:
    return -(-num_rows // tile) * tile


def row_invariant_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tile: int | None,
    *,
    call_rows: int = MAX_CALL_ROWS,
) -> torch.Tensor:
    """``x @ weight.T + bias``, each row's bits the same whatever the other rows of the call
    (for a ``tile`` from :func:`matmul_row_tile`): ``x``'s rows padded to whole ``tile``s, in
    calls of at most ``call_rows`` rows (None: one plain call)."""
    num_rows = x.shape[0]
    if tile is not None and num_rows > call_rows:
        return torch.cat(
            [
                row_invariant_linear(x[start : start + call_rows], weight, bias, tile)
                for start in range(0, num_rows, call_rows)
            ]
        )
    if tile is None or num_rows % tile == 0:
        return torch.nn.functional.linear(x, weight, bias)
    padded = x.new_zeros((padded_rows(num_rows, tile), x.shape[1]))
    padded[:num_rows] = x
    return torch.nn.functional.linear(padded, weight, bias)[:num_rows]


def rows_match_alone(
    linear: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, probe_rows: Sequence[int]
) -> bool:
    """Whether ``linear`` of the first ``n`` rows of ``x`` gives, for each ``n`` of
    ``probe_rows``, every row's bits as ``linear`` of that row alone (every row of every call:
    a kernel may keep a call's first rows and change others)."""
    alone = torch.cat([linear(x[i : i + 1]) for i in range(len(x))])
    return all(torch.equal(linear(x[:num_rows]), alone[:num_rows]) for num_rows in probe_rows)


def probe_row_tiling(is_invariant: Callable[[int, int], bool]) -> tuple[int, int] | None:
    """``(tile, call rows)``: the least tile ``is_invariant(tile, MAX_CALL_ROWS)`` holds for,
    else calls of exactly one ``SPLIT_TILES`` tile each (oneDNN's bf16 kernels on a CPU with AMX:
    measured invariant only up to one tile of 32, or 64, rows, depending on the thread count and
    the weight's layout); None when neither works."""
    for tile in CANDIDATE_TILES:
        if is_invariant(tile, MAX_CALL_ROWS):
            return tile, MAX_CALL_ROWS
    for tile in SPLIT_TILES:
        if is_invariant(tile, tile):
            return tile, tile
    return None


def _is_invariant(tile: int, call_rows: int, dtype: torch.dtype) -> bool:
    generator = torch.Generator().manual_seed(0)
    for cols, rows in _PROBE_SHAPES:
        for column_major in (False, True):
            weight = torch.randn(rows, cols, generator=generator).to(dtype)
            if column_major:
                weight = weight.t().contiguous().t()
            x = torch.randn(max(_PROBE_ROWS), cols, generator=generator).to(dtype)

            def linear(rows: torch.Tensor, weight: torch.Tensor = weight) -> torch.Tensor:
                return row_invariant_linear(rows, weight, None, tile, call_rows=call_rows)

            if not rows_match_alone(linear, x, _PROBE_ROWS):
                return False
    return True


@functools.cache
def _row_tiling(dtype: torch.dtype) -> tuple[int, int] | None:
    """(tile, call rows) that keep this machine's ``dtype`` matmuls row-invariant."""
    return probe_row_tiling(lambda tile, call_rows: _is_invariant(tile, call_rows, dtype))


def matmul_row_tile(dtype: torch.dtype = torch.float32) -> int | None:
    """The row tile that makes this machine's ``dtype`` CPU matmuls row-invariant (with calls
    of :func:`matmul_call_rows` rows at most), or None when none does (then float matmuls are
    not row-invariant here)."""
    tiling = _row_tiling(dtype)
    return None if tiling is None else tiling[0]


def matmul_call_rows(dtype: torch.dtype = torch.float32) -> int:
    """The most rows one row-invariant ``dtype`` matmul call may have on this machine."""
    tiling = _row_tiling(dtype)
    return MAX_CALL_ROWS if tiling is None else tiling[1]


def pointwise_rows(op: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``op(x)`` for an elementwise ``op`` (``sigmoid``, ``softplus``, ...), ``x``'s rows
    padded with zeros to whole multiples of ``POINTWISE_ELEMENTS`` elements on the CPU.

    torch's CPU loops take ``2 * vector`` elements at a time (32 floats with AVX-512) and the
    rest one by one, with scalar functions that differ from the vectorized ones in the last
    bit: a (tokens, 4) gate of 4 tokens ran scalar, of 8 tokens vectorized. Padded, every
    element runs vectorized whatever the row count. Wide rows (a multiple of the chunk) need
    nothing."""
    elements = x.numel()
    if x.device.type != "cpu" or elements % POINTWISE_ELEMENTS == 0:
        return op(x)
    row_elements = max(x[0].numel(), 1) if x.shape[0] else 1
    rows = -(-POINTWISE_ELEMENTS // math.gcd(row_elements, POINTWISE_ELEMENTS))
    padded = x.new_zeros((padded_rows(x.shape[0], rows), *x.shape[1:]))
    padded[: x.shape[0]] = x
    return op(padded)[: x.shape[0]]
