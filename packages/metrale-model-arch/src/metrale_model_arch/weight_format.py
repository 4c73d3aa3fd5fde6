"""How the weights of the projections, the embeddings and the head are stored.

``none``: in the serve dtype, as the checkpoint's values (or its dequantized blocks) cast to it.
``int8``: int8 with a float32 scale per output channel (per vocabulary row for the embeddings
and the head), multiplied by activations written as two int8 digits per value
(:mod:`metrale_kernels.reference.int8_matmul`): a quarter of float32's bytes to stream per
token, and the CPU's int8 dot products. Norms, biases and the KV cache stay in the serve dtype.
``q4``: the layers' projections in 4-bit blocks of 32 with a float16 scale and minimum each
(GGUF's Q4_1, :mod:`metrale_kernels.reference.q4_matmul`; a Q4_1 GGUF's blocks are kept bit
for bit, an AWQ/GPTQ int4 checkpoint's repacked, :mod:`metrale_model_arch.int4_blocks`), 5 bits
a weight; the embeddings and the head int8 as above.
``fp8``: the layers' projections float8_e4m3fn with a float32 scale per output channel, times
activations quantized to fp8 per token as each call runs (W8A8, vLLM's ``--quantization fp8``:
:mod:`metrale_kernels.reference.fp8_matmul`, ``torch._scaled_mm``); the embeddings, the head
and the norms in the serve dtype. A float checkpoint is quantized at load, an fp8 checkpoint
per channel or per tensor keeps its weights as stored, a block-scaled one is requantized per
channel (:mod:`metrale_model_arch.fp8_rows`).
"""

from __future__ import annotations

import enum

from metrale_kernels.reference.q4_matmul import Q4_BLOCK, q4_shape_error

__all__ = [
    "FLOAT16_BYTES",
    "FLOAT32_BYTES",
    "QUANTIZATION_NAMES",
    "Quantization",
    "fp8_matrix_bytes",
    "int8_matrix_bytes",
    "q4_matrix_bytes",
    "q4_shape_error",
]

FLOAT32_BYTES = 4
FLOAT16_BYTES = 2


class Quantization(enum.StrEnum):
    NONE = "none"
    INT8 = "int8"
    Q4 = "q4"
    FP8 = "fp8"


QUANTIZATION_NAMES: tuple[str, ...] = tuple(q.value for q in Quantization)


def int8_matrix_bytes(rows: int, cols: int) -> int:
    """An int8 ``(rows, cols)`` matrix and its float32 scale per row."""
    return rows * cols + rows * FLOAT32_BYTES


def fp8_matrix_bytes(rows: int, cols: int) -> int:
    """An fp8 ``(rows, cols)`` matrix (a byte a weight) and its float32 scale per row."""
    return rows * cols + rows * FLOAT32_BYTES


def q4_matrix_bytes(rows: int, cols: int) -> int:
    """A q4 ``(rows, cols)`` matrix: half a byte a weight, two float16 per block of 32."""
    return rows * cols // 2 + rows * (cols // Q4_BLOCK) * 2 * FLOAT16_BYTES
