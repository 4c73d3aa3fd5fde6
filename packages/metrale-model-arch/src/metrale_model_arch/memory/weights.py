"""Weight bytes by owner, from the config alone.

Owners are the parts of the model a reader asks about: the token embeddings, the decoder
layers, the final norm and the LM head. A head tied to the embeddings is counted once, under
``embeddings``. Quantized checkpoints are dequantized at load, so every weight costs its
parameter count times the serve dtype's size, except parameters the architecture keeps in
float32 (counted apart, in ``ParamCounts.*_fp32``). With int8 weights, the embeddings, the head
and the layers' projections cost a byte per parameter plus a float32 scale per row
(:func:`~metrale_model_arch.weight_format.int8_matrix_bytes`). Each model type's counter is its
architecture record's ``param_counts``.
"""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.counts.llama import llama_param_counts
from metrale_model_arch.owners import (
    EMBEDDINGS,
    FINAL_NORM,
    LAYERS,
    LM_HEAD,
    WEIGHT_OWNERS,
    weight_owner,
)
from metrale_model_arch.registry import param_counts, planned_architecture
from metrale_model_arch.weight_format import FLOAT32_BYTES, Quantization, int8_matrix_bytes

__all__ = [
    "EMBEDDINGS",
    "FINAL_NORM",
    "LAYERS",
    "LM_HEAD",
    "WEIGHT_OWNERS",
    "ParamCounts",
    "WeightBytes",
    "llama_param_counts",
    "param_counts",
    "weight_bytes",
    "weight_owner",
]


@attrs.frozen(kw_only=True)
class WeightBytes:
    embeddings: int
    layers: int
    final_norm: int
    lm_head: int

    def total(self) -> int:
        return self.embeddings + self.layers + self.final_norm + self.lm_head

    def by_owner(self) -> dict[str, int]:
        return {
            EMBEDDINGS: self.embeddings,
            LAYERS: self.layers,
            FINAL_NORM: self.final_norm,
            LM_HEAD: self.lm_head,
        }


def weight_bytes(
    config: ModelConfig, dtype_bytes: int, quantization: Quantization = Quantization.NONE
) -> WeightBytes:
    """Bytes of every weight at ``dtype_bytes`` per element (float32 parameters stay 4)."""
    counts = param_counts(config)
    if quantization == Quantization.INT8:
        return _int8_weight_bytes(config, counts, dtype_bytes)
    return WeightBytes(
        embeddings=counts.embeddings * dtype_bytes,
        layers=counts.layers * dtype_bytes + counts.layers_fp32 * FLOAT32_BYTES,
        final_norm=counts.final_norm * dtype_bytes,
        lm_head=counts.lm_head * dtype_bytes,
    )


def _int8_weight_bytes(config: ModelConfig, counts: ParamCounts, dtype_bytes: int) -> WeightBytes:
    if not planned_architecture(config).int8_linears:
        raise ValueError(
            f"{config.model_type}: int8 weights are not supported for this model type yet; "
            "use quantization 'none'"
        )
    hidden = config.hidden_size
    vocab_rows = counts.embeddings // hidden
    kept = counts.layers - counts.layers_int8_weights
    return WeightBytes(
        embeddings=int8_matrix_bytes(vocab_rows, hidden),
        layers=kept * dtype_bytes
        + counts.layers_fp32 * FLOAT32_BYTES
        + counts.layers_int8_weights
        + counts.layers_int8_rows * FLOAT32_BYTES,
        final_norm=counts.final_norm * dtype_bytes,
        lm_head=int8_matrix_bytes(counts.lm_head // hidden, hidden) if counts.lm_head else 0,
    )
