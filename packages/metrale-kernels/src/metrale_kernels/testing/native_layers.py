"""A backend's fused llama layer ops (``llama_qkv_step``, ``llama_output_step``,
``llama_decode_layer``: the cpu backend's ``metrale::int8_qkv_step``, ...) against their
references, on random inputs: the shared check of the cpu backend's tests, for every
instruction-set path.

Each projection's weight is int8 (``quantize_per_row``) or q4 (``quantize_q4``): the ops take
either, projection by projection; :data:`LAYER_FORMATS` are the mixes checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from metrale_kernels import build_attention_metadata, cos_sin_cache, default_inv_freq
from metrale_kernels.backend import KernelBackend
from metrale_kernels.reference.int8_matmul import quantize_per_row
from metrale_kernels.reference.kv_quantization import dequantize_kv, is_quantized_dtype, quantize_kv
from metrale_kernels.reference.q4_matmul import quantize_q4
from metrale_kernels.testing.parity import watch_reference_ops

# Every projection's rows a multiple of 16 and its input features of 32, as q4 needs.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 96, 6, 2, 16, 160
EPS = 1e-5
LAYER_OPS = ("llama_qkv_step", "llama_output_step", "llama_decode_layer")

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


def check_layer_ops(
    backend: KernelBackend, seed: int = 0, kv_dtype: torch.dtype = torch.float32
) -> None:
    """Raise ``AssertionError`` where one of ``backend``'s layer ops differs from its reference
    beyond float32 rounding (and the int8 digits it can flip), for each of
    :data:`LAYER_FORMATS`, over K/V caches of ``kv_dtype`` (float32 or a quantized one, whose
    written rows must be the reference's bytes), or where ``backend`` ran a reference rather
    than its kernel."""
    reached: list[str] = []
    watched = watch_reference_ops(backend, reached)
    for formats in LAYER_FORMATS:
        try:
            _check_layer(watched, formats, seed, kv_dtype)
        except AssertionError as error:
            raise AssertionError(f"weights {formats} (qkv, o, gate_up, down): {error}") from error
    fallbacks = sorted(set(reached) & set(LAYER_OPS))
    assert not fallbacks, f"{backend.name} ran the references of {fallbacks}"


def _check_layer(
    backend: KernelBackend,
    formats: tuple[WeightFormat, WeightFormat, WeightFormat, WeightFormat],
    seed: int,
    kv_dtype: torch.dtype,
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
    hidden = torch.randn(3, HIDDEN, generator=generator)
    positions = torch.tensor([0, 17, 40])

    qkv_args = (hidden, norm1, EPS, qkv_w, qkv_s, bias, positions, table, HEADS, KV_HEADS, HEAD_DIM)
    got_qkv = backend.llama_qkv_step(*qkv_args)
    want_qkv = KernelBackend.llama_qkv_step.reference(*qkv_args)
    for got, want in zip(got_qkv, want_qkv, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)

    attended = torch.randn(3, HEADS, HEAD_DIM, generator=generator)
    output_args = (hidden, attended, o_w, o_s, None, norm2, EPS, gu_w, gu_s, None, down_w, down_s)
    out = backend.llama_output_step(*output_args, None)
    want_out = KernelBackend.llama_output_step.reference(*output_args, None)
    torch.testing.assert_close(out, want_out, rtol=1e-3, atol=1e-3)

    # A decode-only step of 3 sequences: the fused layer against its reference, and against
    # the backend's own segments with the reference attention between them.
    block_size, lens = 4, [1, 18, 41]
    tables = [[0], [1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]
    metadata = build_attention_metadata(
        block_tables=tables, seq_lens=lens, query_lens=[1, 1, 1], block_size=block_size
    )
    k_cache, v_cache = (
        torch.randn(17, block_size, KV_HEADS, HEAD_DIM, generator=generator) for _ in "kv"
    )
    if is_quantized_dtype(kv_dtype):
        k_cache, v_cache = (quantize_kv(cache, kv_dtype) for cache in (k_cache, v_cache))
    fused_k, fused_v, reference_k, reference_v = (c.clone() for c in (k_cache, v_cache) * 2)
    decode_positions = torch.tensor([n - 1 for n in lens])
    scale = HEAD_DIM**-0.5

    def decode_layer(
        run: Callable[..., torch.Tensor], k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        return run(
            hidden, decode_positions, table, norm1, EPS, qkv_w, qkv_s, bias, HEADS, KV_HEADS,
            HEAD_DIM, k, v, metadata.slot_mapping, metadata.block_tables,
            metadata.seq_lens_tensor, 0, scale, o_w, o_s, None, norm2, gu_w, gu_s, None,
            down_w, down_s, None,
        )  # fmt: skip

    fused = decode_layer(backend.llama_decode_layer, fused_k, fused_v)
    reference = decode_layer(KernelBackend.llama_decode_layer.reference, reference_k, reference_v)
    q, k, v = backend.llama_qkv_step(
        hidden, norm1, EPS, qkv_w, qkv_s, bias, decode_positions, table, HEADS, KV_HEADS, HEAD_DIM
    )
    backend.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
    attended = backend.paged_attention(q.contiguous(), k_cache, v_cache, metadata, scale)
    segments = backend.llama_output_step(
        hidden, attended, o_w, o_s, None, norm2, EPS, gu_w, gu_s, None, down_w, down_s, None
    )
    assert torch.equal(fused_k.view(torch.uint8), k_cache.view(torch.uint8))
    assert torch.equal(fused_v.view(torch.uint8), v_cache.view(torch.uint8))
    # (Quantized rows: the fused k, rounded apart from the reference's, may round to another
    # digit: compared as values.)
    torch.testing.assert_close(
        dequantize_kv(fused_k), dequantize_kv(reference_k), rtol=1e-3, atol=2e-2
    )
    # The attention rows differ by float32 rounding (another summation order), which can flip
    # an int8 digit of the output segment's activations: the bound of the segments above.
    torch.testing.assert_close(fused, segments, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(fused, reference, rtol=1e-3, atol=1e-3)
