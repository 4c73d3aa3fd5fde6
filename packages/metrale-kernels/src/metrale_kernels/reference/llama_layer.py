"""A dense llama-family layer's segments as single ops, composed of the reference ops: the
references of the cpu backend's fused kernels (``metrale::int8_qkv_step``,
``int8_output_step``, ``int8_decode_layer``).

Each projection is given as ``(weight, scales, bias)``: int8 rows with float32 scales
(:mod:`~metrale_kernels.reference.int8_matmul`), or q4's packed blocks (uint8) with their
scales (:mod:`~metrale_kernels.reference.q4_matmul`), projection by projection.
"""

from __future__ import annotations

import torch

from metrale_kernels.attention_metadata import AttentionMetadata
from metrale_kernels.reference import paged_attention
from metrale_kernels.reference.attention import paged_attention as attend
from metrale_kernels.reference.int8_matmul import int8_linear
from metrale_kernels.reference.pointwise import add_rms_norm, apply_rotary, rms_norm, silu_and_mul
from metrale_kernels.reference.q4_matmul import q4_linear


def project(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x (tokens, in)`` times an int8 or a q4 (uint8 ``weight``) projection."""
    if weight.dtype == torch.uint8:
        return q4_linear(x, weight, scales, bias)
    return int8_linear(x, weight, scales, bias)


def llama_qkv_step(
    hidden: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    qkv_weight: torch.Tensor,
    qkv_scales: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The input norm, the fused qkv projection and rotary of ``hidden (tokens, hidden)``:
    ``(q (tokens, heads, head_dim), k, v (tokens, kv_heads, head_dim))``."""
    num_tokens = hidden.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = project(rms_norm(hidden, norm_weight, eps), qkv_weight, qkv_scales, qkv_bias)
    q, k, v = qkv[:, :q_size], qkv[:, q_size : q_size + kv_size], qkv[:, q_size + kv_size :]
    q, k = apply_rotary(
        q.reshape(num_tokens, num_heads, head_dim),
        k.reshape(num_tokens, num_kv_heads, head_dim),
        positions,
        cos_sin_cache,
    )
    return q, k, v.reshape(num_tokens, num_kv_heads, head_dim)


def llama_output_step(
    hidden: torch.Tensor,
    attended: torch.Tensor,
    o_weight: torch.Tensor,
    o_scales: torch.Tensor,
    o_bias: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    gate_up_weight: torch.Tensor,
    gate_up_scales: torch.Tensor,
    gate_up_bias: torch.Tensor | None,
    down_weight: torch.Tensor,
    down_scales: torch.Tensor,
    down_bias: torch.Tensor | None,
) -> torch.Tensor:
    """The output projection of ``attended (tokens, heads, head_dim)``, its residual add to
    ``hidden``, the post-attention norm and the SiLU MLP with its residual: the next layer's
    ``hidden (tokens, hidden)``."""
    projected = project(attended.reshape(hidden.shape[0], -1), o_weight, o_scales, o_bias)
    normed, summed = add_rms_norm(projected, hidden, norm_weight, eps)
    gate_up = project(normed, gate_up_weight, gate_up_scales, gate_up_bias)
    out: torch.Tensor = summed + project(silu_and_mul(gate_up), down_weight, down_scales, down_bias)
    return out


def llama_decode_layer(
    hidden: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    input_norm_weight: torch.Tensor,
    eps: float,
    qkv_weight: torch.Tensor,
    qkv_scales: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    sliding_window: int,
    scale: float,
    o_weight: torch.Tensor,
    o_scales: torch.Tensor,
    o_bias: torch.Tensor | None,
    post_norm_weight: torch.Tensor,
    gate_up_weight: torch.Tensor,
    gate_up_scales: torch.Tensor,
    gate_up_bias: torch.Tensor | None,
    down_weight: torch.Tensor,
    down_scales: torch.Tensor,
    down_bias: torch.Tensor | None,
) -> torch.Tensor:
    """A decode-only step's whole layer: token ``t`` is the one query of sequence ``t``
    (``block_tables[t]``, ``seq_lens[t]`` keys once its own is written at
    ``slot_mapping[t]``); ``sliding_window`` 0 is none. Writes k and v into the caches."""
    q, k, v = llama_qkv_step(
        hidden, input_norm_weight, eps, qkv_weight, qkv_scales, qkv_bias, positions,
        cos_sin_cache, num_heads, num_kv_heads, head_dim,
    )  # fmt: skip
    paged_attention.write_kv(k, v, k_cache, v_cache, slot_mapping)
    num_tokens = hidden.shape[0]
    metadata = AttentionMetadata(
        slot_mapping=slot_mapping,
        query_start_loc=torch.arange(num_tokens + 1, device=hidden.device),
        seq_lens_tensor=seq_lens,
        block_tables=block_tables,
        query_lens=(1,) * num_tokens,
        seq_lens=tuple(int(n) for n in seq_lens.tolist()),
        block_size=k_cache.shape[1],
    )
    attended = attend(q.contiguous(), k_cache, v_cache, metadata, scale, sliding_window or None)
    return llama_output_step(
        hidden, attended, o_weight, o_scales, o_bias, post_norm_weight, eps,
        gate_up_weight, gate_up_scales, gate_up_bias, down_weight, down_scales, down_bias,
    )  # fmt: skip
