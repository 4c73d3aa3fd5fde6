"""The GPU parity harness runs on the CPU with the reference on both sides (so its cases are
sound before a GPU runs them): every case gives no difference. And it tells a kernel from the
reference: a case in which the backend reaches a reference op fails, difference or none."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from metrale_kernels import KernelBackend, TorchBackend
from metrale_kernels.op import kernel
from metrale_kernels.reference import pointwise
from metrale_kernels.reference.kv_quantization import SCALE_BYTES
from metrale_kernels.testing.paged_batches import paged_batch
from metrale_kernels.testing.parity import CASES, TOLERANCE, ParityResult, check_case


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


@pytest.mark.parametrize("case", ["decode ragged gqa4", "decode ragged gqa4 kv fp8_e4m3"])
def test_a_skewed_kernel_is_reported(case: str) -> None:
    error = CASES[case](TorchBackend(), SkewedAttention(), torch.float32, torch.device("cpu"))
    result = ParityResult(case="skewed", max_error=error, tolerance=TOLERANCE[torch.float32])
    assert not result.is_ok
    assert "MISMATCH" in result.line()
    assert not ParityResult(case="nan", max_error=float("nan"), tolerance=1.0).is_ok


class OneScaleOff(TorchBackend):
    """Writes the reference's bytes but for the first token's first key scale, one float16 ulp
    off: a kernel that rounds a scale differently."""

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        super().write_kv(key, value, k_cache, v_cache, slot_mapping)
        rows = k_cache.view(torch.uint8).view(-1, *k_cache.shape[-2:])
        rows[int(slot_mapping[0]), 0, -SCALE_BYTES] ^= 1


@pytest.mark.parametrize("kv_name", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_a_quantized_write_is_compared_byte_for_byte(kv_name: str) -> None:
    case = f"write_kv {kv_name}"
    error = CASES[case](TorchBackend(), OneScaleOff(), torch.bfloat16, torch.device("cpu"))
    assert error == 1.0  # one byte differs
    result = check_case(case, torch.bfloat16, OneScaleOff(), "cpu")
    assert result.tolerance == 0.0
    assert not result.is_ok


@kernel(KernelBackend.rms_norm)
def rms_norm_kernel(
    backend: KernelBackend,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """An rms_norm "kernel": the reference's arithmetic, not through the reference op."""
    return pointwise.rms_norm(x, weight, eps, out=out)


class RmsNormKernel(TorchBackend, kernels=[rms_norm_kernel]):
    pass


@kernel(KernelBackend.rms_norm)
def falling_back_rms_norm(
    backend: KernelBackend,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Takes float32 to the reference op, as the cupy backend falls back; other dtypes get
    the "kernel". The result is the reference's either way."""
    if x.dtype == torch.float32:
        return backend.fallback(KernelBackend.rms_norm, "float32")(x, weight, eps, out=out)
    return pointwise.rms_norm(x, weight, eps, out=out)


class SilentFallback(TorchBackend, kernels=[falling_back_rms_norm]):
    pass


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
    @kernel(KernelBackend.add_rms_norm)
    def twice_through(
        backend: KernelBackend, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        backend.fallback(KernelBackend.add_rms_norm, "once")(*args, **kwargs)
        return backend.fallback(KernelBackend.add_rms_norm, "twice")(*args, **kwargs)

    class TwiceThrough(RmsNormKernel, kernels=[twice_through]):
        pass

    result = check_case("add_rms_norm", torch.float32, TwiceThrough(), "cpu")
    assert result.fallbacks == ("add_rms_norm",)


def test_the_watched_copy_leaves_the_backend_as_it_was() -> None:
    backend = SilentFallback()
    check_case("rms_norm", torch.float32, backend, "cpu")
    assert type(backend) is SilentFallback
