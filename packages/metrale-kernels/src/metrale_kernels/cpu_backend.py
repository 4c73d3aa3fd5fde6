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
  cost of GEMM-shaped speed on long prompts). Caches or activations other than float32 take
  the reference path.

The native ops are built on first use (:mod:`metrale_kernels.native`), which takes seconds
cold: until :meth:`CpuBackend.prepare` has run, every op is the reference's. Creating the
backend also sets the process's malloc to keep a step's freed activations mapped for the next
step (:mod:`metrale_kernels.host_allocator`).
"""

from __future__ import annotations

import logging

import attrs
import torch

from metrale_kernels import int8_matmul
from metrale_kernels import paged_attention as reference_attention
from metrale_kernels.attention_metadata import AttentionMetadata
from metrale_kernels.backend import TorchBackend
from metrale_kernels.column_split import ColumnSplit, row_amax
from metrale_kernels.host_allocator import retain_step_memory
from metrale_kernels.native import NativeBuildError, NativeOps, load_native_ops

logger = logging.getLogger("metrale.kernels")


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


class CpuBackend(TorchBackend):
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

    def int8_linear(
        self,
        x: torch.Tensor,
        qweight: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        out: torch.Tensor | None = None,
        split: ColumnSplit | None = None,
    ) -> torch.Tensor:
        if self.native is None or x.device.type != "cpu":
            return super().int8_linear(x, qweight, scale, bias, out=out, split=split)
        return int8_matmul.int8_linear(
            x, qweight, scale, bias, out=out, int_mm=torch.ops.metrale.int8_mm, split=split
        )

    def q4_linear(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        out: torch.Tensor | None = None,
        split: ColumnSplit | None = None,
    ) -> torch.Tensor:
        if self.native is None or x.device.type != "cpu" or x.dtype != torch.float32:
            return super().q4_linear(x, packed, scales, bias, out=out, split=split)
        if split is None:
            result: torch.Tensor = torch.ops.metrale.q4_mm(x.contiguous(), packed, scales, bias)
            return result if out is None else out.copy_(result)
        amax = row_amax(x, split)
        result = torch.ops.metrale.q4_mm(x.contiguous(), packed, scales, None, amax)
        split.sum_(result)
        if bias is not None:
            result += bias
        return result if out is None else out.copy_(result)

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        *,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        floats = {q.dtype, k_cache.dtype, v_cache.dtype} == {torch.float32}
        if self.native is None or not floats or q.device.type != "cpu":
            return super().paged_attention(
                q, k_cache, v_cache, metadata, scale, sliding_window, out=out
            )
        reference_attention.group_size(q.shape[1], k_cache.shape[2])
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
            )
        return out
