"""``KernelBackend``: the ops models call, each defaulting to its torch reference.

A device backend subclasses it and overrides the ops it has kernels for; every other op falls
back to the reference, so a partial backend is a working one.
"""

from __future__ import annotations

import torch

from metrale_kernels import (
    dsa,
    int8_matmul,
    kda,
    moe_experts,
    moe_routing,
    paged_attention,
    pointwise,
    q4_matmul,
)
from metrale_kernels.attention_metadata import AttentionMetadata
from metrale_kernels.column_split import ColumnSplit
from metrale_kernels.row_invariant_attention import row_invariant_attention


class KernelBackend:
    """The ops a model family calls; the methods here are the torch reference implementations.

    Contract shared by all backends: inputs are not modified unless the op says so (``write_kv``
    writes the caches in place; an ``out=`` tensor receives the result, which is also returned);
    outputs have the dtype of the activations passed in; a K/V cache is one tensor per layer of
    shape ``(num_blocks, block_size, num_kv_heads, head_dim)``. An override returns what the
    reference returns, within the tolerance of its dtype.
    """

    name: str = "reference"

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

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x * rsqrt(mean(x**2) + eps) * weight`` over the last dim, reduced in float32."""
        return pointwise.rms_norm(x, weight, eps, out=out)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual add fused with the next RMSNorm: ``summed = x + residual`` (in the
        activations' dtype) and ``rms_norm(summed)``; returns ``(normed, summed)``."""
        return pointwise.add_rms_norm(x, residual, weight, eps)

    def apply_rotary(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q (tokens, heads, head_dim)``, ``k (tokens, kv_heads, head_dim)`` by position.

        ``cos_sin_cache`` is ``(max_positions, head_dim)``: cos in the first half, sin in the
        second (half-rotation, "neox" layout, as HF Llama applies it).
        """
        return pointwise.apply_rotary(q, k, positions, cos_sin_cache)

    def silu_and_mul(self, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """``silu(x[..., :d]) * x[..., d:]`` for ``x (..., 2d)``; ``out`` is ``(..., d)``."""
        return pointwise.silu_and_mul(x, out=out)

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
        """``x (tokens, in)`` times int8 ``qweight (out, in)`` with per-channel ``scale (out,)``,
        activations in two int8 digits: see :func:`int8_matmul.int8_linear`. ``x``'s dtype out.
        ``split``: ``x`` and ``qweight`` are a rank's columns, the result the whole product's
        (see :mod:`column_split`)."""
        return int8_matmul.int8_linear(x, qweight, scale, bias, out=out, split=split)

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
        """``x (tokens, in)`` times a q4 matrix (``packed``, ``scales``: :mod:`q4_matmul`'s
        layout), activations in two int8 digits. ``x``'s dtype out. The reference dequantizes
        the whole matrix every call: correct, and slow. ``split`` as :meth:`int8_linear`'s."""
        return q4_matmul.q4_linear(x, packed, scales, bias, out=out, split=split)

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store ``key``/``value (tokens, kv_heads, head_dim)`` at their slots, in place."""
        paged_attention.write_kv(key, value, k_cache, v_cache, slot_mapping)

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
        """Causal attention of ``q (tokens, heads, head_dim)`` over each sequence's cached context.

        Query token ``i`` of a sequence sits at position ``seq_len - query_len + i`` and sees
        the keys at positions ``<=`` its own (and ``> position - sliding_window`` when a window
        is set). Grouped-query heads: query head ``h`` reads kv head ``h // (heads // kv_heads)``.
        Only the slots of each sequence's own context are read: table entries past it and
        slots past ``seq_len`` may hold anything (NaN included) without changing the result.
        Returns ``(tokens, heads, head_dim)`` (``out`` when given, which must not alias ``q``);
        raises ``ValueError`` when ``heads`` is not a multiple of ``kv_heads`` or
        ``sliding_window < 1``. On the CPU a row's result depends on its own context alone
        (:mod:`~metrale_kernels.row_invariant_attention`).
        """
        if q.device.type == "cpu":
            return row_invariant_attention(
                q, k_cache, v_cache, metadata, scale, sliding_window, out=out
            )
        return paged_attention.paged_attention(
            q, k_cache, v_cache, metadata, scale, sliding_window, out=out
        )

    def softmax_topk_routing(
        self, router_logits: torch.Tensor, top_k: int, renormalize: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mixtral / Qwen3-MoE routing: see :func:`moe_routing.softmax_topk_routing`."""
        return moe_routing.softmax_topk_routing(router_logits, top_k, renormalize)

    def grouped_sigmoid_topk_routing(
        self,
        router_logits: torch.Tensor,
        correction_bias: torch.Tensor,
        top_k: int,
        *,
        num_groups: int,
        topk_groups: int,
        renormalize: bool,
        routed_scaling_factor: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepSeek-V3 / GLM routing: see :func:`moe_routing.grouped_sigmoid_topk_routing`."""
        return moe_routing.grouped_sigmoid_topk_routing(
            router_logits,
            correction_bias,
            top_k,
            num_groups=num_groups,
            topk_groups=topk_groups,
            renormalize=renormalize,
            routed_scaling_factor=routed_scaling_factor,
        )

    def fused_moe(
        self,
        hidden: torch.Tensor,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        *,
        activation: str = "silu",
        swiglu_limit: float | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Routed experts of ``hidden (tokens, hidden)``: see :func:`moe_experts.fused_moe`."""
        return moe_experts.fused_moe(
            hidden,
            w_gate_up,
            w_down,
            topk_weights,
            topk_ids,
            activation=activation,
            swiglu_limit=swiglu_limit,
            out=out,
        )

    def short_conv(
        self, x: torch.Tensor, weight: torch.Tensor, history: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """KDA's depthwise causal conv + SiLU over one sequence: see :func:`kda.short_conv`."""
        return kda.short_conv(x, weight, history)

    def kda_recurrent(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """KDA over one sequence, token by token: see :func:`kda.kda_recurrent`."""
        return kda.kda_recurrent(q, k, v, g, beta, state)

    def kda_chunked(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
        *,
        chunk_size: int = 64,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """KDA over one sequence, in chunks: see :func:`kda.kda_chunked`."""
        return kda.kda_chunked(q, k, v, g, beta, state, chunk_size=chunk_size)

    def kda_decode_step(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        states: torch.Tensor,
    ) -> torch.Tensor:
        """One KDA token per sequence, ``states`` updated in place: see
        :func:`kda.kda_decode_step`."""
        return kda.kda_decode_step(q, k, v, g, beta, states)

    def pool_index_keys(self, keys: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
        """DSA indexer pooled keys: see :func:`dsa.pool_index_keys`."""
        return dsa.pool_index_keys(keys, gate_logits)

    def index_scores(
        self,
        index_q: torch.Tensor,
        head_weights: torch.Tensor,
        pooled_keys: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """DSA indexer scores of queries against pools: see :func:`dsa.index_scores`."""
        return dsa.index_scores(index_q, head_weights, pooled_keys, scale)

    def select_positions(
        self,
        scores: torch.Tensor,
        positions: torch.Tensor,
        *,
        kpool: int,
        topk_pools: int,
        select_tail: bool,
    ) -> torch.Tensor:
        """The positions each query attends to: see :func:`dsa.select_positions`."""
        return dsa.select_positions(
            scores, positions, kpool=kpool, topk_pools=topk_pools, select_tail=select_tail
        )

    def sparse_latent_attention(
        self,
        q: torch.Tensor,
        latent_cache: torch.Tensor,
        block_table: torch.Tensor,
        selected: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Latent-space MLA over selected positions: see :func:`dsa.sparse_latent_attention`."""
        return dsa.sparse_latent_attention(q, latent_cache, block_table, selected, scale)


class TorchBackend(KernelBackend):
    """The reference ops as they are; also the production path on CPU."""

    name = "torch"
