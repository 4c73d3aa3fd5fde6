"""The native layer ops (``metrale::int8_qkv_step``, ``int8_output_step``,
``int8_decode_layer``) against the same layer composed of a backend's reference ops, on random
inputs: the shared check of the cpu backend's tests, for every instruction-set path.

Each projection's weight is int8 (``quantize_per_row``) or q4 (``quantize_q4``): the ops take
either, projection by projection; :data:`LAYER_FORMATS` are the mixes checked."""

from __future__ import annotations

from typing import Literal

import torch

from metrale_kernels import build_attention_metadata, cos_sin_cache, default_inv_freq
from metrale_kernels.backend import KernelBackend
from metrale_kernels.int8_matmul import quantize_per_row
from metrale_kernels.q4_matmul import quantize_q4

# Every projection's rows a multiple of 16 and its input features of 32, as q4 needs.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 96, 6, 2, 16, 160
EPS = 1e-5

WeightFormat = Literal["int8", "q4"]
# The formats of (qkv, o, gate_up, down): all int8, all q4, and two mixes.
LAYER_FORMATS: tuple[tuple[WeightFormat, WeightFormat, WeightFormat, WeightFormat], ...] = (
    ("int8", "int8", "int8", "int8"),
    ("q4", "q4", "q4", "q4"),
    ("q4", "int8", "q4", "int8"),
    ("int8", "q4", "int8", "q4"),
)


def _weight(
    fmt: WeightFormat, rows: int, cols: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(rows, cols, generator=generator) * 0.2
    return quantize_q4(w) if fmt == "q4" else quantize_per_row(w)


def _linear(
    reference: KernelBackend,
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The reference projection for a weight of either format (uint8: q4)."""
    if weight.dtype == torch.uint8:
        return reference.q4_linear(x, weight, scale, bias)
    return reference.int8_linear(x, weight, scale, bias)


def check_layer_ops(reference: KernelBackend, seed: int = 0) -> None:
    """Raise ``AssertionError`` where a native layer op differs from ``reference``'s ops
    beyond float32 rounding (and the int8 digits it can flip), for each of
    :data:`LAYER_FORMATS`."""
    for formats in LAYER_FORMATS:
        try:
            _check_layer(reference, formats, seed)
        except AssertionError as error:
            raise AssertionError(f"weights {formats} (qkv, o, gate_up, down): {error}") from error


def _check_layer(
    reference: KernelBackend,
    formats: tuple[WeightFormat, WeightFormat, WeightFormat, WeightFormat],
    seed: int,
) -> None:
    generator = torch.Generator().manual_seed(seed)
    q_size, kv_size = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    qkv_format, o_format, gu_format, down_format = formats
    qkv_w, qkv_s = _weight(qkv_format, q_size + 2 * kv_size, HIDDEN, generator)
    o_w, o_s = _weight(o_format, HIDDEN, q_size, generator)
    gu_w, gu_s = _weight(gu_format, 2 * INTER, HIDDEN, generator)
    down_w, down_s = _weight(down_format, HIDDEN, INTER, generator)
    norm1, norm2 = (1 + 0.1 * torch.randn(HIDDEN, generator=generator) for _ in range(2))
    bias = 0.1 * torch.randn(q_size + 2 * kv_size, generator=generator)
    table = cos_sin_cache(default_inv_freq(HEAD_DIM, 10000.0), 64)
    tokens = 3
    hidden = torch.randn(tokens, HIDDEN, generator=generator)
    positions = torch.tensor([0, 17, 40])

    q, k, v = torch.ops.metrale.int8_qkv_step(
        hidden, norm1, EPS, qkv_w, qkv_s, bias, positions, table, HEADS, KV_HEADS, HEAD_DIM
    )
    qkv = _linear(reference, reference.rms_norm(hidden, norm1, EPS), qkv_w, qkv_s, bias)
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
        _linear(reference, attended.reshape(tokens, -1), o_w, o_s), hidden, norm2, EPS
    )
    act = reference.silu_and_mul(_linear(reference, normed, gu_w, gu_s))
    want_out = summed + _linear(reference, act, down_w, down_s)
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
    # The attention rows differ by float32 rounding (another summation order), which can flip
    # an int8 digit of the output segment's activations: the bound of the segments above.
    torch.testing.assert_close(fused, segments, rtol=1e-3, atol=1e-3)
