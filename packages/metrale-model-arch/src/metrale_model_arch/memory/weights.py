"""Weight bytes by owner, from the config alone.

Owners are the parts of the model a reader asks about: the token embeddings, the decoder
layers, the final norm and the LM head. A head tied to the embeddings is counted once, under
``embeddings``. Quantized checkpoints are dequantized at load, so every weight costs its
parameter count times the serve dtype's size, except parameters the architecture keeps in
float32 (counted apart, in ``ParamCounts.*_fp32``). Each model type's counter is its
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
from metrale_model_arch.registry import param_counts

FLOAT32_BYTES = 4

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


def weight_bytes(config: ModelConfig, dtype_bytes: int) -> WeightBytes:
    """Bytes of every weight at ``dtype_bytes`` per element (float32 parameters stay 4)."""
    counts = param_counts(config)
    return WeightBytes(
        embeddings=counts.embeddings * dtype_bytes,
        layers=counts.layers * dtype_bytes + counts.layers_fp32 * FLOAT32_BYTES,
        final_norm=counts.final_norm * dtype_bytes,
        lm_head=counts.lm_head * dtype_bytes,
    )
