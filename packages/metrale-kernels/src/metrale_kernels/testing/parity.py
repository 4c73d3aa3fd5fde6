"""Each CUDA kernel against its torch reference on random inputs, on a CUDA device.

Shared by the GPU tests and ``benches/cuda_check.py``: a case builds its inputs with a seeded
generator, runs the op through :class:`TorchBackend` and :class:`CupyBackend` on the same
device, and reports the largest difference against the dtype's tolerance. Paged caches are
NaN-poisoned everywhere except the slots that hold a sequence's context.

A case in which the backend reaches a reference op (a kernel's ``backend.fallback``, or an op
it has no kernel for) fails whatever the difference, since the reference would then be
compared with itself.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import attrs
import torch

from metrale_kernels.backend import KernelBackend, TorchBackend
from metrale_kernels.op import Op
from metrale_kernels.reference.kv_quantization import SCALE_BYTES, is_quantized_cache
from metrale_kernels.testing.paged_batches import batch_invariance, paged_batch

P = ParamSpec("P")
R = TypeVar("R")
# On the error ``|got - want| / (1 + |want|)``: a few units in the last place of the dtype.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@attrs.frozen(kw_only=True)
class ParityResult:
    case: str
    max_error: float  # max |got - want| / (1 + |want|)
    tolerance: float
    fallbacks: tuple[str, ...] = ()  # the reference ops the backend reached, in call order

    @property
    def is_ok(self) -> bool:
        # NaN anywhere makes the error NaN, which fails this comparison.
        return not self.fallbacks and self.max_error <= self.tolerance

    def line(self) -> str:
        if self.fallbacks:
            status = f"FALLBACK to the reference: {', '.join(self.fallbacks)}"
        else:
            status = "ok" if self.is_ok else "MISMATCH"
        error = f"max |diff|/(1+|ref|) {self.max_error:.3g} (tol {self.tolerance:g})"
        return f"{self.case:<48} {error} {status}"


def _max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape or got.dtype != want.dtype:
        return float("nan")
    if not got.numel():
        return 0.0
    want32 = want.float()
    return float(((got.float() - want32).abs() / (1 + want32.abs())).max())


def _attention_case(
    seq_lens: list[int],
    query_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    sliding_window: int | None,
    kv_dtype: torch.dtype | None = None,
) -> Callable[[KernelBackend, KernelBackend, torch.dtype, torch.device], float]:
    """Attention over caches of ``kv_dtype`` (the query's dtype when None; a quantized cache
    is written by the reference from keys and values of the query's dtype)."""

    def run(
        reference: KernelBackend, cupy: KernelBackend, dtype: torch.dtype, device: torch.device
    ) -> float:
        batch = paged_batch(
            seq_lens=seq_lens,
            query_lens=query_lens,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            device=device,
            kv_dtype=kv_dtype,
        )
        scale = head_dim**-0.5
        got = cupy.paged_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.metadata, scale, sliding_window
        )
        # The reference in float32, rounded once: the tolerance is then the kernel's alone.
        # (It reads a quantized cache as float32.)
        want = reference.paged_attention(
            batch.q.float(),
            _as_float32(batch.k_cache),
            _as_float32(batch.v_cache),
            batch.metadata,
            scale,
            sliding_window,
        )
        return _max_error(got, want.to(dtype))

    return run


def _as_float32(cache: torch.Tensor) -> torch.Tensor:
    return cache if is_quantized_cache(cache) else cache.float()


def _rms_norm(
    reference: KernelBackend, cupy: KernelBackend, dtype: torch.dtype, device: torch.device
) -> float:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(37, 3 * 576, generator=generator).to(device, dtype)[:, 100:676]
    weight = (torch.rand(576, generator=generator) + 0.5).to(device, dtype)
    heads = torch.randn(5, 9 * 64 + 17, generator=generator).to(device, dtype)
    per_head = heads[:, :576].view(5, 9, 64)
    head_weight = weight[:64]
    return max(
        _max_error(cupy.rms_norm(x, weight, 1e-6), reference.rms_norm(x, weight, 1e-6)),
        _max_error(
            cupy.rms_norm(per_head, head_weight, 1e-5),
            reference.rms_norm(per_head, head_weight, 1e-5),
        ),
    )


def _add_rms_norm(
    reference: KernelBackend, cupy: KernelBackend, dtype: torch.dtype, device: torch.device
) -> float:
    generator = torch.Generator().manual_seed(2)
    x, residual = (torch.randn(29, 1000, generator=generator).to(device, dtype) for _ in range(2))
    weight = (torch.rand(1000, generator=generator) + 0.5).to(device, dtype)
    got = cupy.add_rms_norm(x, residual, weight, 1e-6)
    want = reference.add_rms_norm(x, residual, weight, 1e-6)
    return max(_max_error(got[0], want[0]), _max_error(got[1], want[1]))


def _silu_and_mul(
    reference: KernelBackend, cupy: KernelBackend, dtype: torch.dtype, device: torch.device
) -> float:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(41, 2 * 1536, generator=generator).to(device, dtype)
    batched = torch.randn(3, 7, 2 * 96, generator=generator).to(device, dtype)
    return max(
        _max_error(cupy.silu_and_mul(x), reference.silu_and_mul(x)),
        _max_error(cupy.silu_and_mul(batched), reference.silu_and_mul(batched)),
    )


def _rotary(
    reference: KernelBackend, cupy: KernelBackend, dtype: torch.dtype, device: torch.device
) -> float:
    from metrale_kernels.rotary import cos_sin_cache, default_inv_freq

    generator = torch.Generator().manual_seed(4)
    head_dim, num_heads, num_kv_heads, num_tokens = 64, 9, 3, 23
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=generator)
    qkv = qkv.to(device, dtype)
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
    k = k.view(num_tokens, num_kv_heads, head_dim)
    positions = torch.randint(0, 4096, (num_tokens,), generator=generator).to(device)
    table = cos_sin_cache(default_inv_freq(head_dim, 10000.0), 4096).to(device)
    got = cupy.apply_rotary(q, k, positions, table)
    want = reference.apply_rotary(q, k, positions, table)
    return max(_max_error(got[0], want[0]), _max_error(got[1], want[1]))


def _write_kv(
    reference: KernelBackend, cupy: KernelBackend, dtype: torch.dtype, device: torch.device
) -> float:
    generator = torch.Generator().manual_seed(5)
    num_kv_heads, head_dim = 4, 64
    kv = torch.randn(19, 2, num_kv_heads, 2 * head_dim, generator=generator).to(device, dtype)
    key, value = kv[:, 0, :, :head_dim], kv[:, 1, :, head_dim:]
    slots = torch.randperm(10 * 16, generator=generator)[:19].to(device)
    caches = [
        torch.full((10, 16, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=device)
        for _ in range(4)
    ]
    cupy.write_kv(key, value, caches[0], caches[1], slots)
    reference.write_kv(key, value, caches[2], caches[3], slots)
    # Unwritten slots stay NaN in both: compare where the reference wrote.
    written = ~caches[2].isnan()
    if not torch.equal(written, ~caches[0].isnan()):
        return float("nan")
    return max(
        _max_error(caches[0][written], caches[2][written]),
        _max_error(caches[1][written], caches[3][written]),
    )


def _quantized_write_kv_case(
    kv_dtype: torch.dtype,
) -> Callable[[KernelBackend, KernelBackend, torch.dtype, torch.device], float]:
    """``write_kv`` into caches of ``kv_dtype``: the number of cache bytes that differ from the
    reference's run on the CPU (the canonical bytes: torch on CUDA multiplies by 1 / QMAX where
    the CPU divides, so a row's float16 scale may differ in its last bit there)."""

    def run(
        reference: KernelBackend, cupy: KernelBackend, dtype: torch.dtype, device: torch.device
    ) -> float:
        generator = torch.Generator().manual_seed(13)
        num_tokens, num_kv_heads, head_dim = 23, 4, 64
        # Rows over nine decades, a zero row (its scale 0), inputs strided by token and head.
        spread = torch.logspace(-6, 3, num_tokens)[:, None, None, None]
        kv = torch.randn(num_tokens, 2, num_kv_heads, 2 * head_dim, generator=generator) * spread
        kv[0, :, 1] = 0
        kv = kv.to(device, dtype)
        key, value = kv[:, 0, :, :head_dim], kv[:, 1, :, head_dim:]
        slots = torch.randperm(10 * 16, generator=generator)[:num_tokens]
        # Unwritten rows are all-0xFF bytes in both (NaN for fp8).
        shape = (10, 16, num_kv_heads, head_dim + SCALE_BYTES)
        got, want = (
            [torch.full(shape, 0xFF, dtype=torch.uint8, device=on).view(kv_dtype) for _ in "kv"]
            for on in (device, torch.device("cpu"))
        )
        cupy.write_kv(key, value, got[0], got[1], slots.to(device))
        reference.write_kv(key.cpu(), value.cpu(), want[0], want[1], slots)
        return float(
            sum(
                int((g.view(torch.uint8).cpu() != w.view(torch.uint8)).sum())
                for g, w in zip(got, want, strict=True)
            )
        )

    return run


def _softmax_topk(
    reference: KernelBackend, cupy: KernelBackend, dtype: torch.dtype, device: torch.device
) -> float:
    generator = torch.Generator().manual_seed(6)
    worst = 0.0
    for num_experts, top_k, renormalize in ((8, 2, True), (128, 8, False), (60, 4, True)):
        logits = torch.randn(33, num_experts, generator=generator).to(device, dtype)
        got_w, got_ids = cupy.softmax_topk_routing(logits, top_k, renormalize)
        want_w, want_ids = reference.softmax_topk_routing(logits, top_k, renormalize)
        if not torch.equal(got_ids, want_ids):
            return float("nan")
        worst = max(worst, _max_error(got_w, want_w))
    return worst


def _sparse_latent_case(
    num_heads: int, rank: int, seq_len: int, kpool: int, topk_pools: int
) -> Callable[[KernelBackend, KernelBackend, torch.dtype, torch.device], float]:
    def run(
        reference: KernelBackend, cupy: KernelBackend, dtype: torch.dtype, device: torch.device
    ) -> float:
        from metrale_kernels.reference.dsa import select_positions

        generator = torch.Generator().manual_seed(8)
        block_size = 16
        num_blocks = -(-seq_len // block_size) + 2
        table = torch.randperm(num_blocks, generator=generator)[: -(-seq_len // block_size)]
        latent = torch.full((num_blocks, block_size, rank), float("nan"))
        slots = (table[:, None] * block_size + torch.arange(block_size)).flatten()[:seq_len]
        latent.view(-1, rank)[slots] = torch.randn(seq_len, rank, generator=generator)
        positions = torch.tensor([0, 1, kpool - 1, seq_len // 2, seq_len - 1])
        scores = torch.randn(len(positions), seq_len // kpool, generator=generator)
        selected = select_positions(
            scores, positions, kpool=kpool, topk_pools=topk_pools, select_tail=True
        )
        selected[1] = -1  # a query that selected nothing
        q = torch.randn(len(positions), num_heads, rank, generator=generator)
        scale = rank**-0.5
        got = cupy.sparse_latent_attention(
            q.to(device, dtype), latent.to(device, dtype), table.to(device), selected.to(device),
            scale,
        )  # fmt: skip
        want = reference.sparse_latent_attention(
            q.to(device, dtype).float(), latent.to(device, dtype).float(), table.to(device),
            selected.to(device), scale,
        )  # fmt: skip
        return _max_error(got, want.to(dtype))

    return run


def _index_scores(
    reference: KernelBackend, cupy: KernelBackend, dtype: torch.dtype, device: torch.device
) -> float:
    generator = torch.Generator().manual_seed(9)
    worst = 0.0
    for num_queries, num_heads, dim, num_pools in ((7, 32, 128, 100), (3, 64, 128, 33)):
        q = torch.randn(num_queries, num_heads, dim, generator=generator).to(device, dtype)
        weights = torch.randn(num_queries, num_heads, generator=generator).to(device)
        keys = torch.randn(num_pools, dim, generator=generator).to(device)
        got = cupy.index_scores(q, weights * num_heads**-0.5, keys, dim**-0.5)
        want = reference.index_scores(q, weights * num_heads**-0.5, keys, dim**-0.5)
        worst = max(worst, _max_error(got, want))
    return worst


def _grouped_sigmoid_topk(
    reference: KernelBackend, cupy: KernelBackend, dtype: torch.dtype, device: torch.device
) -> float:
    generator = torch.Generator().manual_seed(10)
    worst = 0.0
    # (experts, top_k, groups, topk_groups, renormalize, scaling): DeepSeek-V3's shape first.
    for shape in ((256, 8, 8, 4, True, 2.5), (64, 6, 1, 1, False, 1.0), (160, 4, 32, 3, True, 1.0)):
        num_experts, top_k, num_groups, topk_groups, renormalize, scaling = shape
        logits = torch.randn(29, num_experts, generator=generator).to(device, dtype)
        bias = (0.1 * torch.randn(num_experts, generator=generator)).to(device)
        kwargs = {
            "num_groups": num_groups,
            "topk_groups": topk_groups,
            "renormalize": renormalize,
            "routed_scaling_factor": scaling,
        }
        got_w, got_ids = cupy.grouped_sigmoid_topk_routing(logits, bias, top_k, **kwargs)  # type: ignore[arg-type]
        want_w, want_ids = reference.grouped_sigmoid_topk_routing(logits, bias, top_k, **kwargs)  # type: ignore[arg-type]
        if not torch.equal(got_ids, want_ids):
            return float("nan")
        worst = max(worst, _max_error(got_w, want_w))
    return worst


def _pool_index_keys(
    reference: KernelBackend, cupy: KernelBackend, dtype: torch.dtype, device: torch.device
) -> float:
    generator = torch.Generator().manual_seed(11)
    keys = torch.randn(37, 16, 128, generator=generator).to(device, dtype)
    logits = (3 * torch.randn(37, 16, 128, generator=generator)).to(device, dtype)
    return _max_error(cupy.pool_index_keys(keys, logits), reference.pool_index_keys(keys, logits))


def _select_positions(
    reference: KernelBackend, cupy: KernelBackend, dtype: torch.dtype, device: torch.device
) -> float:
    """Rows compared as sorted sets (their order is unspecified); 0 when equal, else NaN."""
    del dtype  # scores are float32
    generator = torch.Generator().manual_seed(12)
    for seq_len, kpool, topk_pools, select_tail in (
        (5000, 16, 64, True), (300, 1, 32, False), (2000, 4, 600, True), (40, 16, 8, False),
    ):  # fmt: skip
        num_pools = seq_len // kpool
        positions = torch.cat(
            [torch.arange(0, 3), torch.randint(0, seq_len, (20,), generator=generator)]
        )
        scores = torch.randn(len(positions), num_pools, generator=generator).to(device)
        kwargs = {"kpool": kpool, "topk_pools": topk_pools, "select_tail": select_tail}
        got = cupy.select_positions(scores, positions.to(device), **kwargs)  # type: ignore[arg-type]
        want = reference.select_positions(scores, positions.to(device), **kwargs)  # type: ignore[arg-type]
        if got.shape != want.shape or not torch.equal(
            got.sort(dim=1).values, want.sort(dim=1).values
        ):
            return float("nan")
    return 0.0


Case = Callable[[KernelBackend, KernelBackend, torch.dtype, torch.device], float]
KV_DTYPES = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# Attention over each quantized cache, (seq_lens, query_lens, num_heads, num_kv_heads, head_dim,
# sliding_window): decode and prefill rows, windows, split-K, 2-byte loads (even head dims) and
# byte loads (odd).
QUANTIZED_ATTENTION_SHAPES: dict[str, tuple[list[int], list[int], int, int, int, int | None]] = {
    "decode ragged gqa4": ([1, 17, 300, 2049], [1, 1, 1, 1], 8, 2, 64, None),
    "decode gqa8 window": ([40, 1000, 5000], [1, 1, 1], 16, 2, 128, 512),
    "chunked prefill + decode": ([300, 64, 90], [50, 1, 90], 8, 2, 64, None),
    "decode hd33": ([3, 400], [1, 1], 6, 3, 33, None),
}


def _quantized_cache_cases() -> dict[str, Case]:
    """``write_kv`` and attention over each quantized cache format."""
    cases: dict[str, Case] = {}
    for kv_name, kv_dtype in KV_DTYPES.items():
        cases[f"write_kv {kv_name}"] = _quantized_write_kv_case(kv_dtype)
        for name, shape in QUANTIZED_ATTENTION_SHAPES.items():
            cases[f"{name} kv {kv_name}"] = _attention_case(*shape, kv_dtype=kv_dtype)
    return cases


CASES: dict[str, Case] = {
    "rms_norm": _rms_norm,
    "add_rms_norm": _add_rms_norm,
    "silu_and_mul": _silu_and_mul,
    "rotary": _rotary,
    "write_kv": _write_kv,
    "softmax_topk_routing": _softmax_topk,
    "grouped_sigmoid_topk_routing": _grouped_sigmoid_topk,
    "decode ragged gqa4": _attention_case([1, 17, 300, 2049], [1, 1, 1, 1], 8, 2, 64, None),
    "decode mha hd128": _attention_case([5, 700], [1, 1], 4, 4, 128, None),
    "decode gqa8 window": _attention_case([40, 1000, 5000], [1, 1, 1], 16, 2, 128, 512),
    "decode long split-K": _attention_case([9000], [1], 9, 3, 64, None),
    # head_dim 36: 16-byte loads for float32 (4 per load), element loads for the half types.
    "decode hd36": _attention_case([3, 400], [1, 1], 6, 3, 36, None),
    "prefill ragged": _attention_case([33, 130, 7], [33, 130, 7], 9, 3, 64, None),
    "chunked prefill + decode": _attention_case([300, 64, 90], [50, 1, 90], 8, 2, 64, None),
    "prefill window": _attention_case([200, 77], [200, 20], 6, 2, 96, 64),
    "index_scores": _index_scores,
    "pool_index_keys": _pool_index_keys,
    "select_positions": _select_positions,
    "sparse latent rank 512": _sparse_latent_case(16, 512, 600, 16, 8),
    "sparse latent rank 576 kpool 1": _sparse_latent_case(5, 576, 300, 1, 64),
    **_quantized_cache_cases(),
}


def watch_reference_ops(backend: KernelBackend, reached: list[str]) -> KernelBackend:
    """A shallow copy of ``backend`` that appends to ``reached`` the name of each op it runs as
    the reference: an op its class has no kernel for, or a kernel's
    :meth:`~metrale_kernels.backend.KernelBackend.fallback`."""
    cls = type(backend)

    def fallback(self: KernelBackend, op: Op[P, R], reason: str) -> Callable[P, R]:
        reached.append(op.name)
        return cls.fallback(self, op, reason)

    tripwires: dict[str, object] = {
        op.name: _tripwire(op, reached) for op in cls.ops() if op.name in cls.reference_ops()
    }
    watched_class = type(f"Watched{cls.__name__}", (cls,), {"fallback": fallback, **tripwires})
    watched = copy.copy(backend)
    watched.__class__ = watched_class
    return watched


def _tripwire(op: Op[Any, Any], reached: list[str]) -> Callable[..., Any]:
    def run(self: KernelBackend, *args: Any, **kwargs: Any) -> Any:
        reached.append(op.name)
        return op.reference(*args, **kwargs)

    return run


def check_case(
    name: str, dtype: torch.dtype, backend: KernelBackend, device: torch.device | str
) -> ParityResult:
    """Case ``name`` of :data:`CASES`: ``backend`` against :class:`TorchBackend`."""
    reached: list[str] = []
    watched = watch_reference_ops(backend, reached)
    error = CASES[name](TorchBackend(), watched, dtype, torch.device(device))
    return ParityResult(
        case=f"{name} [{str(dtype).removeprefix('torch.')}]",
        max_error=error,
        tolerance=0.0 if name.startswith("write_kv") else TOLERANCE[dtype],
        fallbacks=tuple(dict.fromkeys(reached)),
    )


def run_case(name: str, dtype: torch.dtype, device: torch.device | str = "cuda") -> ParityResult:
    from metrale_kernels.cuda.backend import CupyBackend

    return check_case(name, dtype, CupyBackend(), device)


def run_all(device: torch.device | str = "cuda") -> list[ParityResult]:
    return [run_case(name, dtype, device) for name in CASES for dtype in DTYPES]


def attention_batch_invariance(
    dtype: torch.dtype,
    device: torch.device | str = "cuda",
    num_others: tuple[int, ...] = (7, 63),
    kv_dtype: torch.dtype | None = None,
) -> bool:
    """Whether the cupy backend gives one sequence's decode and prefill rows bit-identical
    alone and among ``num_others`` other sequences (:func:`paged_batches.batch_invariance`),
    over caches of ``kv_dtype`` (``dtype`` when None)."""
    from metrale_kernels.cuda.backend import CupyBackend

    return batch_invariance(
        CupyBackend(), dtype, torch.device(device), num_others, kv_dtype=kv_dtype
    )
