"""The interface every kernel backend implements; models call ops only through it."""

from __future__ import annotations

from typing import Protocol

import torch

from metrale_kernels.attention_metadata import AttentionMetadata


class KernelBackend(Protocol):
    """The ops a model family calls.

    Contract shared by all backends: inputs are not modified unless the op says so (``write_kv``
    writes the caches in place); outputs have the dtype of the activations passed in; a K/V
    cache is one tensor per layer of shape ``(num_blocks, block_size, num_kv_heads, head_dim)``.
    """

    name: str

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``x * rsqrt(mean(x**2) + eps) * weight`` over the last dim, reduced in float32."""
        ...

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
        ...

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(x[..., :d]) * x[..., d:]`` for ``x (..., 2d)``."""
        ...

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store ``key``/``value (tokens, kv_heads, head_dim)`` at their slots, in place."""
        ...

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        """Causal attention of ``q (tokens, heads, head_dim)`` over each sequence's cached context.

        Query token ``i`` of a sequence sits at position ``seq_len - query_len + i`` and sees
        the keys at positions ``<=`` its own (and ``> position - sliding_window`` when a window
        is set). Grouped-query heads: query head ``h`` reads kv head ``h // (heads // kv_heads)``.
        Only the slots of each sequence's own context are read: table entries past it and
        slots past ``seq_len`` may hold anything (NaN included) without changing the result.
        Returns ``(tokens, heads, head_dim)``; raises ``ValueError`` when ``heads`` is not a
        multiple of ``kv_heads`` or ``sliding_window < 1``.
        """
        ...
