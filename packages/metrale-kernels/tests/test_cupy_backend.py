"""The CUDA kernels against the torch reference (GPU only: skipped without a CUDA device)."""

from __future__ import annotations

import pytest
import torch

from metrale_kernels.testing.parity import CASES, DTYPES, attention_batch_invariance, run_case

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cupy() -> None:
    pytest.importorskip("cupy", reason="the cupy backend needs cupy-cuda12x or cupy-cuda13x")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_the_reference(case: str, dtype: torch.dtype) -> None:
    result = run_case(case, dtype)
    assert result.is_ok, result.line()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_rows_do_not_depend_on_the_batch(dtype: torch.dtype) -> None:
    assert attention_batch_invariance(dtype)


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn], ids=str)
def test_attention_rows_over_a_quantized_cache_do_not_depend_on_the_batch(
    kv_dtype: torch.dtype,
) -> None:
    assert attention_batch_invariance(torch.bfloat16, kv_dtype=kv_dtype)
