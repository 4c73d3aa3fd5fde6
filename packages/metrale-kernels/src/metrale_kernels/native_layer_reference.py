"""The native layer ops (``metrale::int8_qkv_step``, ``int8_output_step``,
``int8_decode_layer``) against the same layer composed of a backend's reference ops, on random
inputs: the shared check of the cpu backend's tests, for every instruction-set path."""

from __future__ import annotations

import torch

from metrale_kernels import build_attention_metadata, cos_sin_cache, default_inv_freq
from metrale_kernels.backend import KernelBackend
from metrale_kernels.int8_matmul import quantize_per_row

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 96, 6, 2, 16, 160
EPS = 1e-5


def _int8(rows: int, cols: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_per_row(torch.randn(rows, cols, generator=generator) * 0.2)


def check_layer_ops(reference: KernelBackend, seed: int = 0) -> None:
    """Raise ``AssertionError`` where a native layer op differs from ``reference``'s ops
    beyond float32 rounding (and the int8 digits it can flip)."""
    generator = torch.Generator().manual_seed(seed)
    q_size, kv_size = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    qkv_w, qkv_s = _int8(q_size + 2 * kv_size, HIDDEN, generator)
    o_w, o_s = _int8(HIDDEN, q_size, generator)
    gu_w, gu_s = _int8(2 * INTER, HIDDEN, generator)
    down_w, down_s = _int8(HIDDEN, INTER, generator)
    norm1, norm2 = (1 + 0.1 * torch.randn(HIDDEN, generator=generator) for _ in range(2))
    bias = 0.1 * torch.randn(q_size + 2 * kv_size, generator=generator)
    table = cos_sin_cache(default_inv_freq(HEAD_DIM, 10000.0), 64)
    tokens = 3
    hidden = torch.randn(tokens, HIDDEN, generator=generator)
    positions = torch.tensor([0, 17, 40])

    q, k, v = torch.ops.metrale.int8_qkv_step(
        hidden, norm1, EPS, qkv_w, qkv_s, bias, positions, table, HEADS, KV_HEADS, HEAD_DIM
    )
    qkv = reference.int8_linear(reference.rms_norm(hidden, norm1, EPS), qkv_w, qkv_s, bias)
    want_q, want_k, want_v = (
        qkv[:, :q_size],
        qkv[:, q_size : q_size + kv_size],
        qkv[:, q_size + kv_size :],
    )
    want_q, want_k = reference.apply_rotary(
        want_q.reshape(tokens, HEADS, HEAD_DIM),
        want_k.reshape(tokens, KV_HEADS, HEAD_DIM),
        positions,
        table,
    )
    for got, want in ((q, want_q), (k, want_k), (v, want_v.reshape(tokens, KV_HEADS, HEAD_DIM))):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)

    attended = torch.randn(tokens, HEADS, HEAD_DIM, generator=generator)
    out = torch.ops.metrale.int8_output_step(
        hidden, attended, o_w, o_s, None, norm2, EPS, gu_w, gu_s, None, down_w, down_s, None
    )
    normed, summed = reference.add_rms_norm(
        reference.int8_linear(attended.reshape(tokens, -1), o_w, o_s), hidden, norm2, EPS
    )
    act = reference.silu_and_mul(reference.int8_linear(normed, gu_w, gu_s))
    want_out = summed + reference.int8_linear(act, down_w, down_s)
    torch.testing.assert_close(out, want_out, rtol=1e-3, atol=1e-3)

    # A decode-only step of 3 sequences: the fused layer against the segments it replaces.
    block_size, lens = 4, [1, 18, 41]
    tables = [[0], [1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]
    metadata = build_attention_metadata(
        block_tables=tables, seq_lens=lens, query_lens=[1, 1, 1], block_size=block_size
    )
    k_cache, v_cache = (
        torch.randn(17, block_size, KV_HEADS, HEAD_DIM, generator=generator) for _ in "kv"
    )
    fused_k, fused_v = k_cache.clone(), v_cache.clone()
    decode_positions = torch.tensor([n - 1 for n in lens])
    fused = torch.ops.metrale.int8_decode_layer(
        hidden, decode_positions, table, norm1, EPS, qkv_w, qkv_s, bias, HEADS, KV_HEADS,
        HEAD_DIM, fused_k, fused_v, metadata.slot_mapping, metadata.block_tables,
        metadata.seq_lens_tensor, 0, HEAD_DIM**-0.5, o_w, o_s, None, norm2, gu_w, gu_s, None,
        down_w, down_s, None,
    )  # fmt: skip
    q, k, v = torch.ops.metrale.int8_qkv_step(
        hidden, norm1, EPS, qkv_w, qkv_s, bias, decode_positions, table, HEADS, KV_HEADS, HEAD_DIM
    )
    reference.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
    attended = reference.paged_attention(q.contiguous(), k_cache, v_cache, metadata, HEAD_DIM**-0.5)
    segments = torch.ops.metrale.int8_output_step(
        hidden, attended, o_w, o_s, None, norm2, EPS, gu_w, gu_s, None, down_w, down_s, None
    )
    assert torch.equal(fused_k, k_cache)
    assert torch.equal(fused_v, v_cache)
    torch.testing.assert_close(fused, segments, rtol=1e-4, atol=1e-4)
