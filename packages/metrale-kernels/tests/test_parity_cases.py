"""The GPU parity harness runs on the CPU with the reference on both sides (so its cases are
sound before a GPU runs them): every case gives no difference. And it tells a kernel from the
reference: a case in which the backend reaches a reference op fails, difference or none."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from metrale_kernels import TorchBackend, pointwise
from metrale_kernels.cuda.parity import CASES, TOLERANCE, ParityResult, check_case
from metrale_kernels.paged_batches import paged_batch


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


class RmsNormKernel(TorchBackend):
    """An rms_norm "kernel": the reference's arithmetic, not through the reference op."""

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return pointwise.rms_norm(x, weight, eps, out=out)


class SilentFallback(TorchBackend):
    """Takes float32 to the reference op, as the cupy backend falls back (``super()``), and
    says nothing: the result is the reference's. Other dtypes get the "kernel"."""

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if x.dtype == torch.float32:
            return super().rms_norm(x, weight, eps, out=out)
        return pointwise.rms_norm(x, weight, eps, out=out)


def test_a_kernel_that_matches_passes() -> None:
    result = check_case("rms_norm", torch.float32, RmsNormKernel(), "cpu")
    assert result.max_error == 0.0
    assert result.fallbacks == ()
    assert result.is_ok
    assert result.line().endswith(" ok")


def test_a_silent_fallback_to_the_reference_fails_the_case() -> None:
    result = check_case("rms_norm", torch.float32, SilentFallback(), "cpu")
    assert result.max_error == 0.0  # the difference alone would pass it
    assert result.fallbacks == ("rms_norm",)
    assert not result.is_ok
    assert "FALLBACK to the reference: rms_norm" in result.line()
    # The same backend on an input its "kernel" takes passes.
    assert check_case("rms_norm", torch.bfloat16, SilentFallback(), "cpu").is_ok


@pytest.mark.parametrize("case", ["add_rms_norm", "decode ragged gqa4", "select_positions"])
def test_an_op_without_a_kernel_fails_the_case(case: str) -> None:
    result = check_case(case, torch.float32, RmsNormKernel(), "cpu")
    assert result.max_error == 0.0
    assert not result.is_ok
    assert result.fallbacks
    assert "FALLBACK to the reference" in result.line()


def test_a_fallback_inside_a_kernel_is_named_once_per_op() -> None:
    class TwiceThrough(RmsNormKernel):
        def add_rms_norm(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            super().add_rms_norm(*args, **kwargs)
            return super().add_rms_norm(*args, **kwargs)

    result = check_case("add_rms_norm", torch.float32, TwiceThrough(), "cpu")
    # The reference add_rms_norm calls self.rms_norm: the backend's kernel, not a fallback.
    assert result.fallbacks == ("add_rms_norm",)


def test_the_watched_copy_leaves_the_backend_as_it_was() -> None:
    backend = SilentFallback()
    check_case("rms_norm", torch.float32, backend, "cpu")
    assert type(backend) is SilentFallback
