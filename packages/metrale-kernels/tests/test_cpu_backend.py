"""CpuBackend's native ops against the reference backend on random inputs.

``int8_mm`` must equal the exact integer product (any kernel does; so ``int8_linear`` is the
reference's bit for bit); ``paged_decode`` must give the reference's attention (float32
rounding apart) on ragged batches with GQA, sliding windows and NaN in every slot no sequence
owns, and the same bits for a row alone as inside any batch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from metrale_kernels import TorchBackend, get_backend, quantize_per_row
from metrale_kernels.cpu import native
from metrale_kernels.cpu.backend import CpuBackend
from metrale_kernels.cpu.native import NativeBuildError, NativeOps
from metrale_kernels.reference.kv_quantization import QMAX
from metrale_kernels.testing.native_layers import check_layer_ops
from metrale_kernels.testing.paged_batches import PagedBatch, batch_invariance, paged_batch

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


def cpu_batch(
    seq_lens: list[int],
    query_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    block_size: int,
    seed_offset: int | None = None,
) -> PagedBatch:
    """A float32 CPU batch of 32-wide heads, seeded by its lengths (and ``block_size`` unless
    ``seed_offset`` says otherwise)."""
    return paged_batch(
        seq_lens=seq_lens,
        query_lens=query_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=32,
        dtype=torch.float32,
        device=torch.device("cpu"),
        block_size=block_size,
        seed=sum(seq_lens) + (block_size if seed_offset is None else seed_offset),
    )


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
    batch = cpu_batch(seq_lens, query_lens, num_heads, num_kv_heads, block_size)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.metadata, 0.25, sliding_window)
    expected = TorchBackend().paged_attention(*args)
    got = backend.paged_attention(*args)
    assert not got.isnan().any()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_sequence_gives_the_same_bits_alone_and_in_any_batch(backend: CpuBackend) -> None:
    assert batch_invariance(backend, torch.float32, torch.device("cpu"), num_others=(7, 31))


@pytest.mark.parametrize(("seq_lens", "query_lens"), CASES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEAD_LAYOUTS)
@pytest.mark.parametrize("sliding_window", [None, 6])
def test_paged_attention_with_sinks_matches_the_reference(
    backend: CpuBackend,
    seq_lens: list[int],
    query_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    sliding_window: int | None,
) -> None:
    batch = cpu_batch(seq_lens, query_lens, num_heads, num_kv_heads, block_size=5, seed_offset=0)
    # Sinks below and above the rows' scores: the largest logit of a softmax may be the sink.
    sinks = torch.linspace(-3.0, 8.0, num_heads)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.metadata, 0.25, sliding_window)
    expected = TorchBackend().paged_attention(*args, sinks=sinks)
    got = backend.paged_attention(*args, sinks=sinks)
    assert not got.isnan().any()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.equal(got, expected)  # the native kernel ran, not the reference
    # Without its sinks, a row's weights would sum to one: far from what they give.
    assert (backend.paged_attention(*args) - expected).abs().max() > 0.1


def test_a_sink_of_minus_infinity_changes_nothing(backend: CpuBackend) -> None:
    batch = paged_batch(
        seq_lens=[5, 40, 17, 3],
        query_lens=[1, 8, 1, 3],
        num_heads=6,
        num_kv_heads=2,
        head_dim=32,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    args = (batch.q, batch.k_cache, batch.v_cache, batch.metadata, 0.25)
    sinks = torch.full((6,), float("-inf"))
    assert torch.equal(backend.paged_attention(*args, sinks=sinks), backend.paged_attention(*args))


def test_with_sinks_a_sequence_gives_the_same_bits_alone_and_in_any_batch(
    backend: CpuBackend,
) -> None:
    sinks = torch.linspace(-1.0, 2.0, 8)
    assert batch_invariance(
        backend, torch.float32, torch.device("cpu"), num_others=(7, 31), sinks=sinks
    )


@pytest.mark.parametrize(
    ("rows", "in_features", "out_features"),
    [(1, 64, 64), (2, 96, 130), (6, 100, 256), (7, 64, 200), (40, 512, 1024), (300, 24, 70)],
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_input_major_mm_matches_float64_and_each_row_alone(
    backend: CpuBackend, rows: int, in_features: int, out_features: int, with_bias: bool
) -> None:
    del backend
    generator = torch.Generator().manual_seed(rows + in_features)
    x = torch.randn(rows, in_features, generator=generator)
    # (in, out): contiguous rows, further apart than out.
    w = torch.randn(in_features, out_features + 5, generator=generator)[:, :out_features]
    bias = torch.randn(out_features, generator=generator) if with_bias else None
    out = torch.ops.metrale.input_major_mm(x, w, bias)
    expected = x.double() @ w.double() + (0 if bias is None else bias.double())
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)
    for row in {0, rows // 2, rows - 1}:
        alone = torch.ops.metrale.input_major_mm(x[row : row + 1], w, bias)
        assert torch.equal(alone, out[row : row + 1])


@pytest.mark.parametrize(
    ("rows", "in_features", "out_features"),
    [(7, 3000, 200), (16, 3000, 130), (129, 4500, 70), (300, 3000, 70)],
)
def test_input_major_mm_over_k_blocks_gives_each_row_its_bits_alone_and_into_out(
    backend: CpuBackend, rows: int, in_features: int, out_features: int
) -> None:
    """Past the blocks of K (and a last tile of fewer than 64 columns), each row is still the
    same sum alone or in a batch, returned or written into a strided ``out``."""
    del backend
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features, generator=generator)
    w = torch.randn(in_features, out_features + 3, generator=generator)[:, :out_features]
    bias = torch.randn(out_features, generator=generator)
    got = torch.ops.metrale.input_major_mm(x, w, bias)
    expected = x.double() @ w.double() + bias.double()
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-3)
    into = torch.full((rows, out_features + 2), float("nan"))
    torch.ops.metrale.input_major_mm_out(x, w, bias, into[:, 1:-1])
    assert torch.equal(into[:, 1:-1], got)
    assert into[:, [0, -1]].isnan().all()
    for row in {0, 6, rows // 2, rows - 1}:
        alone = torch.ops.metrale.input_major_mm(x[row : row + 1], w, bias)
        assert torch.equal(alone, got[row : row + 1])
    assert torch.equal(torch.ops.metrale.input_major_mm(x[:7], w, bias), got[:7])


def test_input_major_mm_refuses_what_it_cannot_read(backend: CpuBackend) -> None:
    del backend
    x, w = torch.randn(2, 8), torch.randn(16, 8)
    with pytest.raises(RuntimeError, match="contiguous rows"):
        torch.ops.metrale.input_major_mm(x, w.t(), None)
    with pytest.raises(RuntimeError, match=r"x \(M, K\) and w \(K, N\)"):
        torch.ops.metrale.input_major_mm(x, w, None)
    with pytest.raises(RuntimeError, match=r"out \(M, N\)"):
        torch.ops.metrale.input_major_mm_out(x, torch.randn(8, 16), None, torch.empty(2, 15))


@pytest.mark.parametrize("rows", [1, 5, 16, 40])
@pytest.mark.parametrize("with_bias", [False, True])
def test_row_invariant_linear_of_an_input_major_weight_is_native(
    backend: CpuBackend, rows: int, with_bias: bool
) -> None:
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(200, 96, generator=generator).t().contiguous().t()  # (out, in) view
    bias = torch.randn(200, generator=generator) if with_bias else None
    x = torch.randn(rows, 96, generator=generator)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        got = backend.row_invariant_linear(x, weight, bias, 16)
    assert "metrale::input_major_mm" in {event.name for event in profile.events()}
    expected = TorchBackend().row_invariant_linear(x, weight, bias, 16)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for row in range(rows):
        alone = backend.row_invariant_linear(x[row : row + 1], weight, bias, 16)
        assert torch.equal(alone, got[row : row + 1])


def test_row_invariant_linear_of_a_row_major_weight_is_the_reference(backend: CpuBackend) -> None:
    generator = torch.Generator().manual_seed(0)
    weight, x = torch.randn(200, 96, generator=generator), torch.randn(5, 96, generator=generator)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        got = backend.row_invariant_linear(x, weight, None, 16)
    assert "metrale::input_major_mm" not in {event.name for event in profile.events()}
    assert torch.equal(got, TorchBackend().row_invariant_linear(x, weight, None, 16))


def gpt_oss_experts(
    num_experts: int, hidden: int, inter: int, generator: torch.Generator
) -> dict[str, Any]:
    """fused_moe's arguments for random gpt-oss experts as transformers stores them: input-major
    weights read through transposed views."""
    gate_up = torch.randn(num_experts, hidden, 2 * inter, generator=generator) / hidden**0.5
    down = torch.randn(num_experts, inter, hidden, generator=generator) / inter**0.5
    return {
        "w_gate_up": gate_up.transpose(1, 2),
        "w_down": down.transpose(1, 2),
        "activation": "swigluoai",
        "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0,
        "gate_up_bias": torch.randn(num_experts, 2 * inter, generator=generator),
        "down_bias": torch.randn(num_experts, hidden, generator=generator),
    }


def stacked_experts(
    num_experts: int, hidden: int, inter: int, generator: torch.Generator
) -> dict[str, Any]:
    """fused_moe's arguments for random SwiGLU experts as the loader stores them on the CPU
    (qwen3_moe, mixtral, deepseek, ...): ``(experts, out, in)`` views of ``(experts, in, out)``
    storage."""
    gate_up = torch.randn(num_experts, 2 * inter, hidden, generator=generator) / hidden**0.5
    down = torch.randn(num_experts, hidden, inter, generator=generator) / inter**0.5
    return {
        "w_gate_up": gate_up.transpose(1, 2).contiguous().transpose(1, 2),
        "w_down": down.transpose(1, 2).contiguous().transpose(1, 2),
    }


def clamped_stacked_experts(
    num_experts: int, hidden: int, inter: int, generator: torch.Generator
) -> dict[str, Any]:
    """:func:`stacked_experts` with GLM's clamped SwiGLU."""
    return {**stacked_experts(num_experts, hidden, inter, generator), "swiglu_limit": 0.5}


@pytest.mark.parametrize("num_tokens", [1, 3, 50])
@pytest.mark.parametrize("experts", [gpt_oss_experts, stacked_experts, clamped_stacked_experts])
def test_fused_moe_of_input_major_experts_matches_the_reference(
    backend: CpuBackend,
    num_tokens: int,
    experts: Callable[[int, int, int, torch.Generator], dict[str, Any]],
) -> None:
    generator = torch.Generator().manual_seed(num_tokens)
    options = experts(8, 64, 96, generator)
    w_gate_up, w_down = options.pop("w_gate_up"), options.pop("w_down")
    hidden = torch.randn(num_tokens, 64, generator=generator)
    logits = torch.randn(num_tokens, 8, generator=generator)
    top, ids = logits.topk(2)
    args = (hidden, w_gate_up, w_down, top.softmax(-1), ids)
    expected = TorchBackend().fused_moe(*args, **options)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        got = backend.fused_moe(*args, **options)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # The native matmul ran, not the reference's (at these sizes their bits may agree).
    assert "metrale::input_major_mm" in {event.name for event in profile.events()}
    for token in {0, num_tokens - 1}:
        rows = slice(token, token + 1)
        alone = backend.fused_moe(
            hidden[rows], w_gate_up, w_down, args[3][rows], ids[rows], **options
        )
        assert torch.equal(alone, got[rows])


def test_fused_moe_of_output_major_experts_is_the_reference(backend: CpuBackend) -> None:
    generator = torch.Generator().manual_seed(3)
    w_gate_up = torch.randn(4, 2 * 32, 24, generator=generator)
    w_down = torch.randn(4, 24, 32, generator=generator)
    hidden = torch.randn(5, 24, generator=generator)
    weights, ids = torch.rand(5, 2, generator=generator), torch.tensor([[0, 1]] * 5)
    args = (hidden, w_gate_up, w_down, weights, ids)
    assert torch.equal(backend.fused_moe(*args), TorchBackend().fused_moe(*args))


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
