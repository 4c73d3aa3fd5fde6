"""How the weights of the projections, the embeddings and the head are stored.

``none``: in the serve dtype, as the checkpoint's values (or its dequantized blocks) cast to it.
``int8``: int8 with a float32 scale per output channel (per vocabulary row for the embeddings
and the head), multiplied by activations written as two int8 digits per value
(:mod:`metrale_kernels.int8_matmul`): a quarter of float32's bytes to stream per token, and the
CPU's int8 dot products. Norms, biases and the KV cache stay in the serve dtype.
"""

from __future__ import annotations

import enum

FLOAT32_BYTES = 4


class Quantization(enum.StrEnum):
    NONE = "none"
    INT8 = "int8"


QUANTIZATION_NAMES: tuple[str, ...] = tuple(q.value for q in Quantization)


def int8_matrix_bytes(rows: int, cols: int) -> int:
    """An int8 ``(rows, cols)`` matrix and its float32 scale per row."""
    return rows * cols + rows * FLOAT32_BYTES
