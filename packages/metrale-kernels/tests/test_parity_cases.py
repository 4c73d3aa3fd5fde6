"""The GPU parity harness runs on the CPU with the reference on both sides (so its cases are
sound before a GPU runs them): every case gives no difference."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from metrale_kernels import TorchBackend
from metrale_kernels.cuda.parity import CASES, TOLERANCE, ParityResult, paged_batch


@pytest.mark.parametrize("case", list(CASES))
def test_case_runs_on_the_reference(case: str) -> None:
    error = CASES[case](TorchBackend(), TorchBackend(), torch.float32, torch.device("cpu"))
    assert error == 0.0


def test_paged_batch_poisons_every_slot_outside_the_contexts() -> None:
    batch = paged_batch(
        seq_lens=[5, 20], query_lens=[1, 4], num_heads=4, num_kv_heads=2, head_dim=8,
        dtype=torch.float32, device=torch.device("cpu"),
    )  # fmt: skip
    finite = batch.k_cache.isfinite().all(dim=(-2, -1)).sum()
    assert int(finite) == 25
    assert batch.q.shape == (5, 4, 8)


class SkewedAttention(TorchBackend):
    """Attends like the reference, then shifts every output a little: a kernel bug."""

    def paged_attention(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().paged_attention(*args, **kwargs) + 1e-2


def test_a_skewed_kernel_is_reported() -> None:
    error = CASES["decode ragged gqa4"](
        TorchBackend(), SkewedAttention(), torch.float32, torch.device("cpu")
    )
    result = ParityResult(case="skewed", max_error=error, tolerance=TOLERANCE[torch.float32])
    assert not result.is_ok
    assert "MISMATCH" in result.line()
    assert not ParityResult(case="nan", max_error=float("nan"), tolerance=1.0).is_ok
