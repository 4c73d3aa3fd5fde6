"""Float matmuls padded to whole row tiles: a row's result is the same bits whatever else is in
the call; and the row-invariant attention agrees with dense attention."""

from __future__ import annotations

import pytest
import torch

from metrale_kernels.row_invariant import (
    CANDIDATE_TILES,
    matmul_call_rows,
    matmul_row_tile,
    padded_rows,
    row_invariant_linear,
)


def test_padded_rows_are_whole_tiles() -> None:
    assert [padded_rows(n, 4) for n in (1, 4, 5, 8, 9)] == [4, 4, 8, 8, 12]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_this_machine_has_a_tile_and_rows_keep_their_bits(dtype: torch.dtype) -> None:
    tile, call_rows = matmul_row_tile(dtype), matmul_call_rows(dtype)
    assert tile in CANDIDATE_TILES, "no row tile makes this CPU's matmuls row-invariant"
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(1536, 576, generator=generator).to(dtype)
    bias = torch.randn(1536, generator=generator).to(dtype)
    x = torch.randn(600, 576, generator=generator).to(dtype)

    def linear(rows: torch.Tensor) -> torch.Tensor:
        return row_invariant_linear(rows, weight, bias, tile, call_rows=call_rows)

    alone = torch.cat([linear(x[i : i + 1]) for i in range(600)])
    for num_rows in (2, 3, 7, 17, 70, 300, 600):
        together = linear(x[:num_rows])
        assert torch.equal(together, alone[:num_rows]), num_rows
    torch.testing.assert_close(
        alone.float(), torch.nn.functional.linear(x, weight, bias).float(), rtol=2e-2, atol=2e-2
    )
