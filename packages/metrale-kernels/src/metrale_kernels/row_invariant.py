"""Float matmuls whose rows do not depend on the other rows of the call (row invariance).

A BLAS GEMM computes an output row with the micro-kernel of the row tile it falls in: rows of a
full tile one way, the leftover rows of a call (and a lone row: GEMV) another, so a token's
result changes with how many rows share its step (measured with torch's float32 ``mm`` on an
AVX2 CPU: a row alone, and the last ``M % 4`` rows, differ from the same row among 200 in the
last bits). Padding every call to whole tiles with zero rows puts each row in a full tile,
computed the same way whatever else is in the call. The tile is probed on this machine at run
time (:func:`matmul_row_tile`), since machines of one class differ in their kernels.
"""

from __future__ import annotations

import functools

import torch

# Tiles tried, smallest first; a padded call costs at most tile - 1 extra rows.
CANDIDATE_TILES = (4, 8, 16, 32)
# (in, out) shapes probed: small and large reductions, both weight layouts.
_PROBE_SHAPES = ((64, 96), (512, 1024))
_PROBE_ROWS = (1, 2, 3, 5, 7, 9, 13, 33)


def padded_rows(num_rows: int, tile: int) -> int:
    return -(-num_rows // tile) * tile


def row_invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tile: int | None
) -> torch.Tensor:
    """``x @ weight.T + bias`` with ``x``'s rows padded to whole ``tile``s (None: unpadded)."""
    num_rows = x.shape[0]
    if tile is None or num_rows % tile == 0:
        return torch.nn.functional.linear(x, weight, bias)
    padded = x.new_zeros((padded_rows(num_rows, tile), x.shape[1]))
    padded[:num_rows] = x
    return torch.nn.functional.linear(padded, weight, bias)[:num_rows]


def _tile_is_invariant(tile: int, dtype: torch.dtype) -> bool:
    generator = torch.Generator().manual_seed(0)
    for cols, rows in _PROBE_SHAPES:
        for column_major in (False, True):
            weight = torch.randn(rows, cols, generator=generator).to(dtype)
            if column_major:
                weight = weight.t().contiguous().t()
            x = torch.randn(max(_PROBE_ROWS), cols, generator=generator).to(dtype)
            alone = row_invariant_linear(x[:1], weight, None, tile)[0]
            for num_rows in _PROBE_ROWS:
                if not torch.equal(
                    row_invariant_linear(x[:num_rows], weight, None, tile)[0], alone
                ):
                    return False
    return True


@functools.cache
def matmul_row_tile(dtype: torch.dtype = torch.float32) -> int | None:
    """The least row tile that makes this machine's ``dtype`` CPU matmuls row-invariant, or
    None when no candidate does (then float matmuls are not row-invariant here)."""
    for tile in CANDIDATE_TILES:
        if _tile_is_invariant(tile, dtype):
            return tile
    return None
