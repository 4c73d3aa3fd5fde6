"""Dequantizing GGUF blocks: vectorized over a whole tensor for the common 32-value formats.

``gguf.quants.dequantize`` works a group of rows at a time in Python; for the formats the
default model is stored in (Q4_0, Q4_1, Q8_0) one numpy expression over every block of the
tensor gives the same floats several times faster. Other formats go to ``gguf.quants``.

ggml's layouts, one block per 32 values: Q8_0 = f16 scale ``d``, 32 int8 ``q``: ``d * q``;
Q4_0 = ``d``, 16 bytes of nibbles: ``d * (q - 8)``; Q4_1 = ``d``, f16 minimum ``m``, nibbles:
``d * q + m``. The low nibbles are values 0..15 of the block, the high nibbles 16..31.
"""

from __future__ import annotations

import gguf
import numpy as np

_FAST_TYPES = {
    gguf.GGMLQuantizationType.Q8_0,
    gguf.GGMLQuantizationType.Q4_0,
    gguf.GGMLQuantizationType.Q4_1,
}


def dequantize(blocks: np.ndarray, ggml_type: gguf.GGMLQuantizationType) -> np.ndarray:
    """``blocks`` (..., bytes of a row) uint8 -> float32 (..., values of a row)."""
    if ggml_type not in _FAST_TYPES:
        return np.asarray(gguf.quants.dequantize(blocks, ggml_type), dtype=np.float32)
    block_bytes = gguf.GGML_QUANT_SIZES[ggml_type][1]
    leading = blocks.shape[:-1]
    raw = np.ascontiguousarray(blocks).reshape(-1, block_bytes)
    scale = raw[:, :2].view(np.float16).astype(np.float32)  # (blocks, 1)
    if ggml_type == gguf.GGMLQuantizationType.Q8_0:
        values = raw[:, 2:].view(np.int8).astype(np.float32) * scale
    else:
        offset = 4 if ggml_type == gguf.GGMLQuantizationType.Q4_1 else 2
        packed = raw[:, offset:]
        nibbles = np.concatenate((packed & 0x0F, packed >> 4), axis=1).astype(np.float32)
        if ggml_type == gguf.GGMLQuantizationType.Q4_1:
            minimum = raw[:, 2:4].view(np.float16).astype(np.float32)
            values = nibbles * scale + minimum
        else:
            values = (nibbles - 8.0) * scale
    return values.reshape(*leading, -1)
