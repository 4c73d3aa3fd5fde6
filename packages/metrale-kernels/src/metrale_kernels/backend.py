"""``KernelBackend``: the ops models call, each defaulting to its torch reference.

A device backend subclasses it and overrides the ops it has kernels for; every other op falls
back to the reference, so a partial backend is a working one.
"""

from __future__ import annotations

import torch

from metrale_kernels import int8_matmul, moe_experts, moe_routing, paged_attention, pointwise
from metrale_kernels.attention_metadata import AttentionMetadata


class KernelBackend:
    """The ops a model family calls; the methods here are the torch reference implementations.

    Contract shared by all backends: inputs are not modified unless the op says so (``write_kv``
    writes the caches in place; an ``out=`` tensor receives the result, which is also returned);
    outputs have the dtype of the activations passed in; a K/V cache is one tensor per layer of
    shape ``(num_blocks, block_size, num_kv_heads, head_dim)``. An override returns what the
    reference returns, within the tolerance of its dtype.
    """

    name: str = "reference"

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x * rsqrt(mean(x**2) + eps) * weight`` over the last dim, reduced in float32."""
        return pointwise.rms_norm(x, weight, eps, out=out)

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
    ) -> torch.Tensor:
        """``x (tokens, in)`` times int8 ``qweight (out, in)`` with per-channel ``scale (out,)``,
        activations in two int8 digits: see :func:`int8_matmul.int8_linear`. ``x``'s dtype out."""
        return int8_matmul.int8_linear(x, qweight, scale, bias, out=out)

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
        ``sliding_window < 1``.
        """
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


class TorchBackend(KernelBackend):
    """The reference ops as they are; also the production path on CPU."""

    name = "torch"
