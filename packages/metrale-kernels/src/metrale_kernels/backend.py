"""``KernelBackend``: the ops models call, each declared once by its torch reference.

Each op is an :class:`~metrale_kernels.op.Op` here, made from its reference function (in
:mod:`metrale_kernels.reference`), which is the op's signature and contract. A device backend
subclasses it naming its kernels (``kernels=``, see :func:`~metrale_kernels.op.kernel`); every
op without one is its reference, so a partial backend is a working one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

from metrale_kernels import row_invariant
from metrale_kernels.op import Kernel, Op, resolve_ops, served_by_reference
from metrale_kernels.reference import (
    attention,
    dsa,
    fp8_matmul,
    int8_matmul,
    kda,
    llama_layer,
    moe_experts,
    moe_routing,
    paged_attention,
    pointwise,
    q4_matmul,
)

P = ParamSpec("P")
R = TypeVar("R")


class KernelBackend:
    """The ops a model family calls, each served by a backend's kernel or its reference.

    Contract shared by all backends: inputs are not modified unless the op says so (``write_kv``
    writes the caches in place; an ``out=`` tensor receives the result, which is also returned);
    outputs have the dtype of the activations passed in; a K/V cache is one tensor per layer of
    shape ``(num_blocks, block_size, num_kv_heads, head_dim)``. A kernel returns what the
    reference returns, within the tolerance of its dtype.
    """

    name: str = "reference"

    rms_norm = Op(pointwise.rms_norm)
    add_rms_norm = Op(pointwise.add_rms_norm)
    apply_rotary = Op(pointwise.apply_rotary)
    silu_and_mul = Op(pointwise.silu_and_mul)
    int8_linear = Op(int8_matmul.int8_linear)
    q4_linear = Op(q4_matmul.q4_linear)
    fp8_linear = Op(fp8_matmul.fp8_linear)
    row_invariant_linear = Op(row_invariant.row_invariant_linear)
    write_kv = Op(paged_attention.write_kv)
    paged_attention = Op(attention.paged_attention)
    softmax_topk_routing = Op(moe_routing.softmax_topk_routing)
    grouped_sigmoid_topk_routing = Op(moe_routing.grouped_sigmoid_topk_routing)
    grouped_softmax_topk_routing = Op(moe_routing.grouped_softmax_topk_routing)
    fused_moe = Op(moe_experts.fused_moe)
    short_conv = Op(kda.short_conv)
    kda_recurrent = Op(kda.kda_recurrent)
    kda_chunked = Op(kda.kda_chunked)
    kda_decode_step = Op(kda.kda_decode_step)
    pool_index_keys = Op(dsa.pool_index_keys)
    index_scores = Op(dsa.index_scores)
    select_positions = Op(dsa.select_positions)
    sparse_latent_attention = Op(dsa.sparse_latent_attention)
    llama_qkv_step = Op(llama_layer.llama_qkv_step)
    llama_output_step = Op(llama_layer.llama_output_step)
    llama_decode_layer = Op(llama_layer.llama_decode_layer)

    def __init_subclass__(cls, *, kernels: Iterable[Kernel[Any, Any, Any]] = (), **kwargs: Any):
        super().__init_subclass__(**kwargs)
        resolve_ops(cls, cls.ops(), kernels)

    @classmethod
    def ops(cls) -> list[Op[Any, Any]]:
        """Every op, in declaration order (an op declared later, e.g. by a test, included)."""
        return [value for value in vars(KernelBackend).values() if isinstance(value, Op)]

    @classmethod
    def reference_ops(cls) -> list[str]:
        """The names of the ops this backend runs as their references, sorted."""
        return served_by_reference(cls, cls.ops())

    def fallback(self, op: Op[P, R], reason: str) -> Callable[P, R]:
        """The reference of ``op``, for an input a kernel does not take (``reason``): a kernel
        returns ``backend.fallback(op, reason)(<its arguments>)``."""
        del reason
        return op.reference

    def prepare(self, *, build: bool = True) -> None:
        """Make the backend's kernels ready (compiling what must be, unless ``build`` is
        false); may take seconds, so engines call it off the serving path. Until it has run
        an op may take its reference path."""
        del build

    def needs_prepare(self) -> bool:
        """Whether :meth:`prepare` has work left to do."""
        return False

    def describe(self) -> str:
        """What runs the ops, for the boot log."""
        return self.name


class TorchBackend(KernelBackend):
    """The reference ops as they are; also the production path on CPU."""

    name = "torch"
