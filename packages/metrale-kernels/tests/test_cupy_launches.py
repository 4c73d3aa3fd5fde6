"""The cupy backend's launches, checked on the CPU against the kernel sources: every op
launches kernels that exist, with one argument of the right C type per parameter, and a
launch shape the hardware takes. (The kernels themselves need a GPU: test_cupy_backend.py.)"""

from __future__ import annotations

import logging
import math
import re
import warnings
from typing import Any

import numpy
import pytest
import torch

from metrale_kernels import TorchBackend, build_attention_metadata
from metrale_kernels.cuda import launch as cuda_launch
from metrale_kernels.cuda.backend import CupyBackend
from metrale_kernels.cuda.sources import SOURCES_BY_NAME, source_code
from metrale_kernels.reference.kv_quantization import SCALE_BYTES
from metrale_kernels.rotary import cos_sin_cache, default_inv_freq
from metrale_kernels.testing.paged_batches import paged_batch
from metrale_kernels.testing.parity import CASES, DTYPES, check_case

_SIGNATURE = re.compile(
    r'extern "C" __global__ void\s+(?:__launch_bounds__\(\w+\)\s+)?'
    r"(\w+?)(_##KV##)?(?:_##SUFFIX)?\s*\(([^)]*)\)"
)
_DEFINE = re.compile(r"^#define (\w+) (\d+)", re.MULTILINE)
# A kernel's carve-up of its dynamic shared memory: ``float* k_s = q_s + n;  // (TILE, dim)``.
_SHARED_BUFFER = re.compile(r"float\* \w+ = [^;]+;[ \t]*// \(([^)]*)\)")
_KINDS = {
    numpy.uint64: "pointer",
    numpy.int32: "int",
    numpy.int64: "long long",
    numpy.float32: "float",
}


def _parameter_kinds(source: str) -> dict[str, list[str]]:
    """Each kernel's parameters (by base name, the dtype suffix left off; ``<base>_KV`` for a
    quantized cache's) as C type kinds."""
    kinds = {}
    code = source_code(SOURCES_BY_NAME[source]).replace("\\\n", " ")
    for name, kv, params in _SIGNATURE.findall(code):
        kinds[f"{name}_KV" if kv else name] = [
            "pointer" if "*" in p else "long long" if "long long" in p else p.split()[0]
            for p in (part.strip() for part in params.split(","))
        ]
    return kinds


def _defines(source: str) -> dict[str, int]:
    return {
        name: int(value) for name, value in _DEFINE.findall(source_code(SOURCES_BY_NAME[source]))
    }


def _declared_shared_floats(source: str, **sizes: int) -> int:
    """The floats of a kernel's shared buffers as its source declares them: the product of
    each buffer's shape comment, each a sum of ``sizes`` (the source's names) and integers."""
    code = source_code(SOURCES_BY_NAME[source])
    shapes = _SHARED_BUFFER.findall(code)
    assert shapes, f"no shared buffers declared in {source}"
    return sum(
        math.prod(_dimension(dim, sizes) for dim in shape.split(",") if dim.strip())
        for shape in shapes
    )


def _dimension(expression: str, sizes: dict[str, int]) -> int:
    """A shape comment's dimension: a sum of the source's names and integers (``head_dim + 1``)."""
    terms = [term.strip() for term in expression.split("+")]
    return sum(sizes[term] if term.isidentifier() else int(term) for term in terms)


Launch = tuple[str, str, tuple[int, ...], tuple[int, ...], tuple[Any, ...], int]


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[Launch]:
    recorded: list[Launch] = []

    def record(
        source: str,
        function: str,
        device: torch.device,
        grid: tuple[int, ...],
        block: tuple[int, ...],
        args: tuple[Any, ...],
        *,
        shared_mem_bytes: int = 0,
    ) -> None:
        recorded.append((source, function, grid, block, args, shared_mem_bytes))

    monkeypatch.setattr(cuda_launch, "launch", record)
    monkeypatch.setattr(cuda_launch, "on_cuda", lambda tensor: True)
    return recorded


def _backend() -> CupyBackend:
    backend = CupyBackend.__new__(CupyBackend)
    backend._fallbacks_logged = set()
    return backend


def _run_every_op(backend: CupyBackend, dtype: torch.dtype) -> None:
    x = torch.randn(5, 3 * 64).to(dtype)
    weight = torch.ones(64, dtype=dtype)
    backend.rms_norm(x[:, :64], weight, 1e-6)
    backend.rms_norm(x.view(5, 3, 64), weight, 1e-6)
    backend.add_rms_norm(x[:, :64].contiguous(), x[:, 64:128].contiguous(), weight, 1e-6)
    backend.silu_and_mul(x[:, :128])
    q, k = x.view(5, 3, 64)[:, :2], x.view(5, 3, 64)[:, 2:]
    table = cos_sin_cache(default_inv_freq(64, 10000.0), 32)
    backend.apply_rotary(q, k, torch.arange(5), table)
    caches = [torch.zeros(4, 16, 1, 64, dtype=dtype) for _ in range(2)]
    backend.write_kv(k, k, caches[0], caches[1], torch.arange(5))
    batch = paged_batch(
        seq_lens=[700, 3], query_lens=[1, 3], num_heads=8, num_kv_heads=2, head_dim=64,
        dtype=dtype, device=torch.device("cpu"),
    )  # fmt: skip
    backend.paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.metadata, 0.125, 256)
    logits = torch.randn(7, 64).to(dtype)
    backend.softmax_topk_routing(logits, 4, True)
    backend.grouped_sigmoid_topk_routing(
        logits, torch.zeros(64), 4, num_groups=8, topk_groups=2, renormalize=True
    )
    backend.pool_index_keys(torch.randn(3, 4, 32).to(dtype), torch.randn(3, 4, 32).to(dtype))
    backend.select_positions(
        torch.randn(4, 50),
        torch.tensor([0, 100, 799, 420]),
        kpool=16,
        topk_pools=8,
        select_tail=True,
    )
    backend.index_scores(
        torch.randn(3, 4, 32).to(dtype), torch.randn(3, 4), torch.randn(9, 32), 0.2
    )
    latent = torch.randn(4, 16, 512).to(dtype)
    selected = torch.tensor([[0, 5, -1], [-1, -1, -1]])
    backend.sparse_latent_attention(
        torch.randn(2, 16, 512).to(dtype), latent, torch.arange(4), selected, 0.04
    )


EXPECTED_FUNCTIONS = {
    "rms_norm", "add_rms_norm", "silu_and_mul", "rotary", "write_kv",
    "paged_attention_partial", "paged_attention_combine", "softmax_topk",
    "grouped_sigmoid_topk", "index_scores", "sparse_latent_attention", "pool_index_keys",
    "select_positions",
}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_launch_matches_its_kernels_signature(
    launches: list[Launch], dtype: torch.dtype
) -> None:
    _run_every_op(_backend(), dtype)
    suffix = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    launched = set()
    for source, function, grid, block, args, shared_mem_bytes in launches:
        assert function in SOURCES_BY_NAME[source].functions
        base = function.removesuffix(f"_{suffix}")
        assert base != function or function == "select_positions", function
        launched.add(base)
        assert [_KINDS[type(a)] for a in args] == _parameter_kinds(source)[base], function
        assert all(n >= 1 for n in grid), (function, grid)
        assert all(n <= 65535 for n in grid[1:]), (function, grid)
        threads = block[0]
        assert threads % 32 == 0, (function, threads)
        assert threads <= 1024
        assert shared_mem_bytes <= 48 * 1024
    assert launched == EXPECTED_FUNCTIONS


KV_FORMATS = {torch.int8: "i8", torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}


@pytest.mark.parametrize("kv_dtype", list(KV_FORMATS), ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("head_dim", "pair_loads"), [(64, 1), (34, 1), (33, 0)])
def test_quantized_caches_launch_their_kernels(
    launches: list[Launch],
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    head_dim: int,
    pair_loads: int,
) -> None:
    batch = paged_batch(
        seq_lens=[700, 3], query_lens=[1, 3], num_heads=8, num_kv_heads=2, head_dim=head_dim,
        dtype=dtype, device=torch.device("cpu"), kv_dtype=kv_dtype,
    )  # fmt: skip
    assert batch.k_cache.shape[-1] == head_dim + SCALE_BYTES
    backend = _backend()
    kv = torch.randn(5, 2, head_dim).to(dtype)
    backend.write_kv(kv, kv, batch.k_cache, batch.v_cache, torch.arange(5))
    backend.paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.metadata, 0.125, 256)
    suffix = cuda_launch.dtype_suffix(dtype)
    kv_format = KV_FORMATS[kv_dtype]
    write, partial, _ = launches
    assert [launch[1] for launch in launches] == [
        f"write_kv_{kv_format}_{suffix}",
        f"paged_attention_partial_{kv_format}_{suffix}",
        f"paged_attention_combine_{suffix}",
    ]
    for source, function, *_ in launches:
        assert function in SOURCES_BY_NAME[source].functions
    kinds = _parameter_kinds("kv_write")["write_kv_KV"]
    assert [_KINDS[type(a)] for a in write[4]] == kinds
    kinds = _parameter_kinds("paged_attention")["paged_attention_partial_KV"]
    assert [_KINDS[type(a)] for a in partial[4]] == kinds
    # The head dim the kernels index rows by is the values', not the row's (which holds the
    # scale too); the partial pass's last argument turns its 2-byte loads on or off.
    assert write[4][6] == head_dim
    assert partial[4][11] == head_dim
    assert partial[4][-1] == pair_loads


def test_paged_attention_splits_long_rows_and_bounds_the_partials(launches: list[Launch]) -> None:
    metadata = build_attention_metadata(
        block_tables=[list(range(70))], seq_lens=[1100], query_lens=[1], block_size=16
    )
    q = torch.randn(1, 4, 64, dtype=torch.bfloat16)
    cache = torch.zeros(70, 16, 4, 64, dtype=torch.bfloat16)
    _backend().paged_attention(q, cache, cache, metadata, 0.125)
    (_, partial, grid, _, _, _), (_, combine, combine_grid, _, _, _) = launches
    assert partial == "paged_attention_partial_bf16"
    assert grid == (1, 4, 5)  # 1100 keys in splits of 256
    assert combine == "paged_attention_combine_bf16"
    assert combine_grid == (1, 4)


# (group, head_dim, whether the kernel takes it): (4, 352) and (1, 512) need more shared memory
# than the 48 KiB a block gets without opting in, (16, 256) more accumulators than a thread has.
ATTENTION_LAYOUTS = [
    (1, 64, True), (4, 64, True), (8, 128, True), (16, 128, True), (32, 64, True),
    (4, 320, True), (4, 352, False), (1, 512, False), (16, 256, False),
]  # fmt: skip


@pytest.mark.parametrize(("group", "head_dim", "takes"), ATTENTION_LAYOUTS)
def test_paged_attention_asks_for_the_shared_memory_its_kernel_declares(
    launches: list[Launch], group: int, head_dim: int, takes: bool
) -> None:
    defines = _defines("paged_attention")
    needed = 4 * _declared_shared_floats(
        "paged_attention", group=group, head_dim=head_dim, TILE=defines["ATTENTION_TILE"]
    )
    accumulators = defines["MAX_ACCUMULATORS"] * defines["ATTENTION_THREADS"]
    assert takes == (needed <= 48 * 1024 and group * head_dim <= accumulators)
    batch = paged_batch(
        seq_lens=[40, 3], query_lens=[1, 3], num_heads=2 * group, num_kv_heads=2,
        head_dim=head_dim, dtype=torch.float32, device=torch.device("cpu"),
    )  # fmt: skip
    args = (batch.q, batch.k_cache, batch.v_cache, batch.metadata, head_dim**-0.5)

    out = _backend().paged_attention(*args)

    if takes:
        partial = [shared for _, name, *_, shared in launches if "partial" in name]
        assert partial == [needed]
    else:  # the reference, not a launch the hardware would refuse
        assert not launches
        torch.testing.assert_close(out, TorchBackend().paged_attention(*args), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", list(CASES))
def test_every_parity_case_launches_kernels_and_reaches_no_reference_op(
    launches: list[Launch], case: str, dtype: torch.dtype
) -> None:
    # The launches do nothing here: the outputs are garbage, only the dispatch is checked.
    result = check_case(case, dtype, _backend(), "cpu")
    assert result.fallbacks == ()
    assert launches


def test_a_backend_that_falls_back_fails_the_parity_case(
    launches: list[Launch], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cuda_launch, "dtype_suffix", lambda dtype: None)  # no kernel takes it
    result = check_case("rms_norm", torch.float32, _backend(), "cpu")
    assert not launches
    assert result.max_error == 0.0
    assert result.fallbacks == ("rms_norm",)
    assert not result.is_ok


def test_an_input_without_a_kernel_falls_back_to_the_reference(launches: list[Launch]) -> None:
    x = torch.randn(3, 8, dtype=torch.float64)
    weight = torch.ones(8, dtype=torch.float64)
    out = _backend().rms_norm(x, weight, 1e-6)
    assert not launches
    torch.testing.assert_close(out, TorchBackend().rms_norm(x, weight, 1e-6), rtol=0, atol=0)
    # The reference reduces in float32: float64 inputs get float32's precision.
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)


def test_the_backend_says_which_ops_run_the_reference(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("metrale_kernels.cuda.backend.import_cupy", lambda: None)
    with caplog.at_level(logging.DEBUG, logger="metrale.kernels"):
        CupyBackend()
    (line,) = [r.getMessage() for r in caplog.records if "torch reference runs" in r.getMessage()]
    reference_ops = set(line.split("runs ", 1)[1].split(", "))
    assert {"fused_moe", "int8_linear", "kda_chunked", "short_conv"} <= reference_ops
    kernel_ops = {
        "rms_norm", "add_rms_norm", "silu_and_mul", "apply_rotary", "write_kv",
        "paged_attention", "softmax_topk_routing", "grouped_sigmoid_topk_routing",
        "index_scores", "sparse_latent_attention", "pool_index_keys", "select_positions",
    }  # fmt: skip
    assert not reference_ops & kernel_ops


def test_a_fallback_is_said_once_per_op_and_reason(
    launches: list[Launch], caplog: pytest.LogCaptureFixture
) -> None:
    backend = _backend()
    x = torch.randn(3, 8, dtype=torch.float64)
    with caplog.at_level(logging.DEBUG, logger="metrale.kernels"):
        backend.rms_norm(x, torch.ones(8, dtype=torch.float64), 1e-6)
        backend.rms_norm(x, torch.ones(8, dtype=torch.float64), 1e-6)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert lines[0].startswith("cupy backend: rms_norm falls back to the torch reference")


def test_the_launch_stream_wraps_torchs_without_a_deprecated_class() -> None:
    """cupy 14 deprecates ``ExternalStream`` (a DeprecationWarning fails the GPU tests): the
    launch stream comes from ``Stream.from_external`` over torch's handle. Wrapping a handle
    calls no CUDA API, so this runs without a GPU."""
    cupy = pytest.importorskip("cupy")
    if not hasattr(cupy.cuda.Stream, "from_external"):
        pytest.skip(f"cupy {cupy.__version__} predates Stream.from_external")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream = cuda_launch.cupy_stream(cupy, 0x1234, 0)
    assert isinstance(stream, cupy.cuda.Stream)
    assert stream.ptr == 0x1234
