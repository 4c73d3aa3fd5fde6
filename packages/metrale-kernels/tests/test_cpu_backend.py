"""CpuBackend's native ops against the reference backend on random inputs.

``int8_mm`` must equal the exact integer product (any kernel does; so ``int8_linear`` is the
reference's bit for bit); ``paged_decode`` must give the reference's attention (float32
rounding apart) on ragged batches with GQA, sliding windows and NaN in every slot no sequence
owns, and the same bits for a row alone as inside any batch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from metrale_kernels import TorchBackend, get_backend, quantize_per_row
from metrale_kernels.cpu import native
from metrale_kernels.cpu.backend import CpuBackend
from metrale_kernels.cpu.native import NativeBuildError, NativeOps
from metrale_kernels.reference.kv_quantization import QMAX
from metrale_kernels.testing.native_layers import check_layer_ops
from metrale_kernels.testing.paged_batches import batch_invariance, paged_batch

# (heads, kv_heads): group sizes 1, 3 and 4.
HEAD_LAYOUTS = [(4, 4), (6, 2), (8, 2)]
BLOCK_SIZES = [1, 5, 16]


@pytest.fixture(scope="module")
def backend(native_ops: NativeOps) -> CpuBackend:
    del native_ops
    cpu = CpuBackend()
    assert cpu.native is not None
    return cpu


@pytest.mark.parametrize(
    ("rows", "out_features", "in_features"),
    [
        (1, 5, 7),
        (2, 13, 100),
        (3, 96, 64),
        (4, 70, 576),
        (8, 33, 130),
        (9, 40, 64),
        (40, 17, 96),
        (130, 300, 576),
    ],
)
def test_int8_mm_is_the_exact_integer_product(
    backend: CpuBackend, rows: int, out_features: int, in_features: int
) -> None:
    del backend
    generator = torch.Generator().manual_seed(rows * 1000 + in_features)
    a = torch.randint(-127, 128, (rows, in_features), generator=generator, dtype=torch.int8)
    w = torch.randint(-127, 128, (out_features, in_features), generator=generator, dtype=torch.int8)
    expected = (a.to(torch.int64) @ w.to(torch.int64).T).to(torch.int32)
    assert torch.equal(torch.ops.metrale.int8_mm(a, w), expected)
    # Extreme values: every product at its largest, in both signs.
    full = torch.full((rows, in_features), -127, dtype=torch.int8)
    assert torch.equal(
        torch.ops.metrale.int8_mm(full, w.abs()),
        (full.to(torch.int64) @ w.abs().T.to(torch.int64)).int(),
    )


@pytest.mark.parametrize("tokens", [1, 2, 5, 30])
def test_int8_linear_is_the_references_bit_for_bit(backend: CpuBackend, tokens: int) -> None:
    generator = torch.Generator().manual_seed(tokens)
    qweight, scale = quantize_per_row(torch.randn(200, 96, generator=generator))
    x = torch.randn(tokens, 96, generator=generator)
    bias = torch.randn(200, generator=generator)
    expected = TorchBackend().int8_linear(x, qweight, scale, bias)
    assert torch.equal(backend.int8_linear(x, qweight, scale, bias), expected)


def test_int8_mm_refuses_mismatched_operands(backend: CpuBackend) -> None:
    del backend
    with pytest.raises(RuntimeError, match="int8_mm"):
        torch.ops.metrale.int8_mm(
            torch.zeros(2, 8, dtype=torch.int8), torch.zeros(3, 9, dtype=torch.int8)
        )


CASES = [
    # (seq_lens, query_lens): decode only, mixed with prefills and chunks, long contexts.
    ([1, 7, 33, 64], [1, 1, 1, 1]),
    ([5, 40, 17, 3], [1, 8, 1, 3]),
    ([300, 2, 129], [1, 1, 1]),
]


@pytest.mark.parametrize(("seq_lens", "query_lens"), CASES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEAD_LAYOUTS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("sliding_window", [None, 1, 6])
def test_paged_attention_matches_the_reference(
    backend: CpuBackend,
    seq_lens: list[int],
    query_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    block_size: int,
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
        block_size=block_size,
        seed=sum(seq_lens) + block_size,
    )
    args = (batch.q, batch.k_cache, batch.v_cache, batch.metadata, 0.25, sliding_window)
    expected = TorchBackend().paged_attention(*args)
    got = backend.paged_attention(*args)
    assert not got.isnan().any()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_sequence_gives_the_same_bits_alone_and_in_any_batch(backend: CpuBackend) -> None:
    assert batch_invariance(backend, torch.float32, torch.device("cpu"), num_others=(7, 31))


def test_other_dtypes_take_the_reference_path(backend: CpuBackend) -> None:
    batch = paged_batch(
        seq_lens=[9, 20],
        query_lens=[1, 1],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
        block_size=4,
    )
    args = (batch.q, batch.k_cache, batch.v_cache, batch.metadata, 0.5)
    assert torch.equal(backend.paged_attention(*args), TorchBackend().paged_attention(*args))


def test_auto_on_the_cpu_is_the_cpu_backend_with_its_native_ops(backend: CpuBackend) -> None:
    del backend  # the ops are built: there is a compiler
    chosen = get_backend("cpu", "auto")
    assert type(chosen) is CpuBackend
    chosen.prepare()
    assert chosen.native is not None
    assert chosen.describe().startswith("cpu backend: native int8_mm")
    assert type(get_backend("cpu", "torch")) is TorchBackend


def _outcome(call: Callable[[], NativeOps]) -> BaseException:
    """What ``call`` raised: a build error or a skip (a skip is no exception to ``raises``)."""
    try:
        call()
    except (NativeBuildError, pytest.skip.Exception) as raised:
        return raised
    raise AssertionError("the native ops loaded: neither a build error nor a skip")


def test_native_tests_skip_without_a_compiler_and_fail_on_a_broken_build(
    native_ops_or_skip: Callable[[], NativeOps],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(native, "_loaded", None)  # as if nothing were loaded yet
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    skipped = _outcome(native_ops_or_skip)
    assert isinstance(skipped, pytest.skip.Exception)
    assert "no C++ compiler" in str(skipped)
    broken = tmp_path / "broken-c++"
    broken.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo "broken 1.0" && exit 0\n'
        'echo "error: this compiler is broken" >&2\nexit 1\n'
    )
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    failed = _outcome(native_ops_or_skip)
    assert isinstance(failed, NativeBuildError)
    assert "this compiler is broken" in str(failed)


@pytest.mark.parametrize("kv_dtype", [torch.float32, *QMAX])
def test_the_native_layer_ops_match_the_reference_ops(
    backend: CpuBackend, kv_dtype: torch.dtype
) -> None:
    for seed in range(3):
        check_layer_ops(backend, seed, kv_dtype)
