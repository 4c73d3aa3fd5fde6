"""``CpuBackend``: the reference ops, with native C++ kernels where they beat them on a CPU.

- ``int8_linear`` multiplies the int8 digits with ``metrale::int8_mm``: for a few rows (decode)
  it streams the weight once at the memory's speed, where oneDNN's GEMM reaches a third of it;
  for more rows it is oneDNN's. Integer sums being exact, the result is bit-identical to the
  reference either way, so a sequence's tokens do not depend on which kernel ran.
- ``q4_linear`` (float32 activations) is ``metrale::q4_mm``: the 4-bit blocks unpacked in
  registers, never as a dequantized matrix; the same integer sums as the reference's.
- ``paged_attention`` attends every query row of the step with ``metrale::paged_decode``,
  reading K/V blocks in place: a prefill's tokens are rows over their causal context, like a
  decode's, so a token's attention is the same whatever step it is in (row invariance; at the
  cost of GEMM-shaped speed on long prompts). Float32 or quantized caches (int8 or fp8 rows,
  dequantized as they are read), float32 activations, and gpt-oss's sinks (one more logit per
  head in each softmax); others take the reference path.
- ``row_invariant_linear`` with a float32 weight stored input-major (the CPU loader's layout)
  is ``metrale::input_major_mm`` (below): a row's bits do not depend on the call's other rows
  without padding them to a GEMM tile, and one row reads the weight once, ~3x the speed of a
  padded GEMM (the vocabulary head at decode); past ~8 rows it is 0.6-1.2x its time on a head
  (a head's prompt logprobs). Other weights take the reference.
- ``fused_moe`` with float32 experts stored input-major (transformers' gpt-oss layout, and the
  other families' stacked experts as the CPU loader stores them; the op reads both through
  transposed views) multiplies each expert's rows with
  ``metrale::input_major_mm``: every output its own fma chain over the inputs, so a token's
  result is the same whatever else chose its expert, without padding rows to a GEMM tile (a
  decode step's one or two rows per expert read the weight once). Other layouts take the
  reference.
- ``llama_qkv_step``, ``llama_output_step`` and ``llama_decode_layer`` (float32) are a dense
  llama layer's segments as one native call each (``metrale::int8_qkv_step``, ...), where the
  reference runs ~50 small ops.

The native ops are built on first use (:mod:`metrale_kernels.cpu.native`), which takes seconds
cold: until :meth:`CpuBackend.prepare` has run, every op is the reference's. Creating the
backend also sets the process's malloc to keep a step's freed activations mapped for the next
step (:mod:`metrale_kernels.cpu.host_allocator`).
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import torch

from metrale_kernels.attention_metadata import AttentionMetadata
from metrale_kernels.backend import KernelBackend, TorchBackend
from metrale_kernels.column_split import ColumnSplit, row_amax
from metrale_kernels.cpu.host_allocator import retain_step_memory
from metrale_kernels.cpu.native import NativeBuildError, NativeOps, load_native_ops
from metrale_kernels.op import kernel
from metrale_kernels.reference import int8_matmul, moe_experts
from metrale_kernels.reference import paged_attention as reference_attention
from metrale_kernels.reference.kv_quantization import is_quantized_cache
from metrale_kernels.row_invariant import MAX_CALL_ROWS

logger = logging.getLogger("metrale.kernels")
Tensor = torch.Tensor


@attrs.frozen(kw_only=True, eq=False)
class QueryRows:
    """Every query token of the step as a row the native kernel attends on its own."""

    rows: torch.Tensor  # (rows,) int64: the token index of each row
    seqs: torch.Tensor  # (rows,) int64: its sequence (a row of the block tables)
    seq_lens: torch.Tensor  # (rows,) int64: keys up to here (its position + 1)
    first_keys: torch.Tensor  # (rows,) int64: keys from here (a sliding window's start)


def plan_query_rows(metadata: AttentionMetadata, sliding_window: int | None) -> QueryRows:
    """A prefill's tokens are rows like a decode's, each over its causal context: a token's
    attention is then computed the same way whatever step it is in (row invariance)."""
    reference_attention.check_sliding_window(sliding_window)
    seqs: list[int] = []
    ends: list[int] = []
    for seq, (query_len, seq_len) in enumerate(
        zip(metadata.query_lens, metadata.seq_lens, strict=True)
    ):
        seqs += [seq] * query_len
        ends += range(seq_len - query_len + 1, seq_len + 1)
    return QueryRows(
        rows=torch.arange(len(seqs), dtype=torch.int64),
        seqs=torch.tensor(seqs, dtype=torch.int64),
        seq_lens=torch.tensor(ends, dtype=torch.int64),
        first_keys=torch.tensor(
            [reference_attention.first_visible(end - 1, sliding_window) for end in ends],
            dtype=torch.int64,
        ),
    )


def _native_floats(backend: CpuBackend, x: Tensor) -> bool:
    return backend.native is not None and x.device.type == "cpu" and x.dtype == torch.float32


@kernel(KernelBackend.int8_linear)
def int8_linear(
    backend: CpuBackend,
    x: Tensor,
    qweight: Tensor,
    scale: Tensor,
    bias: Tensor | None = None,
    *,
    out: Tensor | None = None,
    int_mm: int8_matmul.IntMatmul | None = None,
    split: ColumnSplit | None = None,
) -> Tensor:
    if int_mm is None and backend.native is not None and x.device.type == "cpu":
        int_mm = torch.ops.metrale.int8_mm
    return int8_matmul.int8_linear(x, qweight, scale, bias, out=out, int_mm=int_mm, split=split)


@kernel(KernelBackend.q4_linear)
def q4_linear(
    backend: CpuBackend,
    x: Tensor,
    packed: Tensor,
    scales: Tensor,
    bias: Tensor | None = None,
    *,
    out: Tensor | None = None,
    split: ColumnSplit | None = None,
) -> Tensor:
    if not _native_floats(backend, x):
        reference = backend.fallback(KernelBackend.q4_linear, "not float32 native")
        return reference(x, packed, scales, bias, out=out, split=split)
    if split is None:
        result: Tensor = torch.ops.metrale.q4_mm(x.contiguous(), packed, scales, bias)
        return result if out is None else out.copy_(result)
    amax = row_amax(x, split)
    result = torch.ops.metrale.q4_mm(x.contiguous(), packed, scales, None, amax)
    split.sum_(result)
    if bias is not None:
        result += bias
    return result if out is None else out.copy_(result)


@kernel(KernelBackend.paged_attention)
def paged_attention(
    backend: CpuBackend,
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    *,
    out: Tensor | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    native_cache = k_cache.dtype == torch.float32 or is_quantized_cache(k_cache)
    if (
        backend.native is None
        or q.dtype != torch.float32
        or not native_cache
        or q.device.type != "cpu"
    ):
        reference = backend.fallback(KernelBackend.paged_attention, "not float32 native")
        return reference(q, k_cache, v_cache, metadata, scale, sliding_window, out=out, sinks=sinks)
    reference_attention.group_size(q.shape[1], k_cache.shape[2])
    reference_attention.check_cache_shape(q, k_cache, v_cache)
    plan = metadata.derived(("native_rows", sliding_window), plan_query_rows, sliding_window)
    q = q.contiguous()
    if out is None:
        out = torch.empty_like(q)
    if plan.rows.numel():
        torch.ops.metrale.paged_decode(
            q,
            k_cache,
            v_cache,
            plan.rows,
            plan.seqs,
            metadata.block_tables,
            plan.seq_lens,
            plan.first_keys,
            scale,
            out,
            None if sinks is None else sinks.float().contiguous(),
        )
    return out


def input_major_linear(
    x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor | None = None
) -> Tensor:
    """``x @ weight.T + bias`` for a ``weight (out, in)`` stored input-major, written to ``out``
    (float32, contiguous rows) when given."""
    contiguous_bias = None if bias is None else bias.contiguous()
    if out is None:
        result: Tensor = torch.ops.metrale.input_major_mm(
            x.contiguous(), weight.t(), contiguous_bias
        )
        return result
    torch.ops.metrale.input_major_mm_out(x.contiguous(), weight.t(), contiguous_bias, out)
    return out


@kernel(KernelBackend.row_invariant_linear)
def row_invariant_linear(
    backend: CpuBackend,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    tile: int | None,
    *,
    call_rows: int = MAX_CALL_ROWS,
) -> Tensor:
    is_input_major = weight.dim() == 2 and weight.stride(0) == 1
    if not _native_floats(backend, x) or weight.dtype != torch.float32 or not is_input_major:
        reference = backend.fallback(KernelBackend.row_invariant_linear, "not float32 input-major")
        return reference(x, weight, bias, tile, call_rows=call_rows)
    return input_major_linear(x, weight, bias)


@kernel(KernelBackend.fused_moe)
def fused_moe(
    backend: CpuBackend,
    hidden: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    **options: Any,
) -> Tensor:
    weights = (w_gate_up, w_down, options.get("gate_up_bias"), options.get("down_bias"))
    if (
        not _native_floats(backend, hidden)
        or "expert_linear" in options
        or any(w is not None and w.dtype != torch.float32 for w in weights)
        or w_gate_up.stride(1) != 1
        or w_down.stride(1) != 1
    ):
        reference = backend.fallback(KernelBackend.fused_moe, "not float32 input-major experts")
        return reference(hidden, w_gate_up, w_down, topk_weights, topk_ids, **options)
    return moe_experts.fused_moe(
        hidden,
        w_gate_up,
        w_down,
        topk_weights,
        topk_ids,
        expert_linear=input_major_linear,
        **options,
    )


# The layer ops pass their arguments as they come to the native ops, whose schemas take them
# in the references' order (see :mod:`metrale_kernels.reference.llama_layer`).
@kernel(KernelBackend.llama_qkv_step)
def llama_qkv_step(
    backend: CpuBackend, hidden: Tensor, *args: Any, **kwargs: Any
) -> tuple[Tensor, Tensor, Tensor]:
    if kwargs or not _native_floats(backend, hidden):
        reference = backend.fallback(KernelBackend.llama_qkv_step, "not float32 native")
        return reference(hidden, *args, **kwargs)
    q, k, v = torch.ops.metrale.int8_qkv_step(hidden.contiguous(), *args)
    return q, k, v


@kernel(KernelBackend.llama_output_step)
def llama_output_step(backend: CpuBackend, hidden: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    if kwargs or not _native_floats(backend, hidden):
        reference = backend.fallback(KernelBackend.llama_output_step, "not float32 native")
        return reference(hidden, *args, **kwargs)
    out: Tensor = torch.ops.metrale.int8_output_step(hidden.contiguous(), *args)
    return out


@kernel(KernelBackend.llama_decode_layer)
def llama_decode_layer(backend: CpuBackend, hidden: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    if kwargs or not _native_floats(backend, hidden):
        reference = backend.fallback(KernelBackend.llama_decode_layer, "not float32 native")
        return reference(hidden, *args, **kwargs)
    out: Tensor = torch.ops.metrale.int8_decode_layer(hidden.contiguous(), *args)
    return out


KERNELS = (
    int8_linear,
    q4_linear,
    paged_attention,
    row_invariant_linear,
    fused_moe,
    llama_qkv_step,
    llama_output_step,
    llama_decode_layer,
)


class CpuBackend(TorchBackend, kernels=KERNELS):
    """A cached build of the native ops is loaded at once; else :meth:`prepare` builds it."""

    name = "cpu"

    def __init__(self) -> None:
        self.native: NativeOps | None = None
        self.native_error: str | None = None
        self.retains_step_memory = retain_step_memory()
        self.prepare(build=False)

    def prepare(self, *, build: bool = True) -> None:
        """Load the native ops (building them first unless ``build`` is false) and use them
        from now on; where they cannot be built the reference ops stay, the reason logged."""
        if self.native is not None or self.native_error is not None:
            return
        try:
            self.native = load_native_ops(build=build)
        except NativeBuildError as error:
            self.native_error = str(error)
            logger.warning("native CPU kernels unavailable, reference ops serve: %s", error)

    def needs_prepare(self) -> bool:
        return self.native is None and self.native_error is None

    def describe(self) -> str:
        if self.native is not None:
            return f"cpu backend: {self.native.describe()}"
        if self.native_error is not None:
            return "cpu backend: reference ops (the native ones failed to build)"
        return "cpu backend: reference ops until the native ones are built"
