"""Weight bytes by owner, from the config alone.

Owners are the parts of the model a reader asks about: the token embeddings, the decoder layers, the
final norm and the LM head, and the MTP layers of a family that loads them (glm4_moe, deepseek_v3:
``weights.mtp``, kept for MTP speculation) and the vision tower of a family that loads one
(glm5_next: ``weights.vision``, at the serve dtype). A head tied to the embeddings is counted once,
under ``embeddings``. Quantized checkpoints are dequantized at load, so every weight costs its
parameter count times the serve dtype's size, except parameters the architecture keeps in float32
(counted apart, in ``ParamCounts.*_fp32``); an FP8 checkpoint's scales are read and dropped, so it
costs what its float checkpoint would. With int8 weights, the embeddings, the head and the layers'
projections cost a byte per parameter plus a float32 scale per row
(:func:`~metrale_model_arch.weight_format.int8_matrix_bytes`). With q4 weights the layers'
projections cost :func:`~metrale_model_arch.weight_format.q4_matrix_bytes` each instead, the
embeddings and the head int8 as before; an AWQ/GPTQ checkpoint's projections become exactly such
blocks, plus GPTQ ``desc_act``'s input orders
(:func:`~metrale_model_arch.int4_format.input_order_bytes`). With fp8 weights the layers'
projections cost :func:`~metrale_model_arch.weight_format.fp8_matrix_bytes` each (a byte a
weight, a float32 scale a row), everything else (the embeddings, the head, the norms) the serve
dtype. Each model type's counter is its architecture record's ``param_counts``.
"""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.counts.llama import llama_param_counts
from metrale_model_arch.int4_format import input_order_bytes, int4_support_error
from metrale_model_arch.owners import (
    EMBEDDINGS,
    FINAL_NORM,
    LAYERS,
    LM_HEAD,
    MTP,
    VISION,
    WEIGHT_OWNERS,
    weight_owner,
)
from metrale_model_arch.registry import param_counts, planned_architecture
from metrale_model_arch.weight_format import (
    FLOAT32_BYTES,
    Quantization,
    fp8_matrix_bytes,
    int8_matrix_bytes,
    q4_matrix_bytes,
    q4_shape_error,
)

__all__ = [
    "EMBEDDINGS",
    "FINAL_NORM",
    "LAYERS",
    "LM_HEAD",
    "MTP",
    "VISION",
    "WEIGHT_OWNERS",
    "ParamCounts",
    "WeightBytes",
    "fp8_support_error",
    "llama_param_counts",
    "param_counts",
    "q4_support_error",
    "weight_bytes",
    "weight_owner",
]


@attrs.frozen(kw_only=True)
class WeightBytes:
    """``mtp``: the multi-token-prediction layers a family loads (glm4_moe, deepseek_v3),
    ``vision``: its vision tower (glm5_next), else zero; each an owner of ``by_owner`` only
    when non-zero."""

    embeddings: int
    layers: int
    final_norm: int
    lm_head: int
    mtp: int = 0
    vision: int = 0

    def total(self) -> int:
        return sum(self.by_owner().values())

    def by_owner(self) -> dict[str, int]:
        return {
            EMBEDDINGS: self.embeddings,
            LAYERS: self.layers,
            FINAL_NORM: self.final_norm,
            LM_HEAD: self.lm_head,
            **({MTP: self.mtp} if self.mtp else {}),
            **({VISION: self.vision} if self.vision else {}),
        }


def weight_bytes(
    config: ModelConfig, dtype_bytes: int, quantization: Quantization = Quantization.NONE
) -> WeightBytes:
    """Bytes of every weight at ``dtype_bytes`` per element (float32 parameters stay 4)."""
    counts = param_counts(config)
    if (error := int4_support_error(config)) is not None:
        raise ValueError(error)
    if quantization in (Quantization.INT8, Quantization.Q4):
        return _quantized_weight_bytes(config, counts, dtype_bytes, quantization)
    if quantization == Quantization.FP8:
        return _fp8_weight_bytes(config, counts, dtype_bytes)
    return WeightBytes(
        embeddings=counts.embeddings * dtype_bytes,
        layers=counts.layers * dtype_bytes + counts.layers_fp32 * FLOAT32_BYTES,
        final_norm=counts.final_norm * dtype_bytes,
        lm_head=counts.lm_head * dtype_bytes,
        mtp=counts.mtp * dtype_bytes + counts.mtp_fp32 * FLOAT32_BYTES,
        vision=counts.vision * dtype_bytes,
    )


def q4_support_error(config: ModelConfig) -> str | None:
    """Why ``config``'s model cannot take q4 weights, or None."""
    if not planned_architecture(config).int8_linears:
        return f"{config.model_type}: q4 weights are not supported for this model type yet"
    for rows, cols in param_counts(config).layers_projection_shapes:
        if (error := q4_shape_error(rows, cols)) is not None:
            return f"{config.model_type}: {error}"
    return None


# The ggml types of a GGUF whose projections fp8 may quantize (floats, not blocks).
FLOAT_GGML_TYPES = frozenset({"F32", "F16", "BF16"})


def fp8_support_error(config: ModelConfig) -> str | None:
    """Why ``config``'s model cannot take fp8 weights (``--quantization fp8``), or None: the
    model type has no fp8 projections yet, or its checkpoint is already quantized coarser (a
    4-bit or 8-bit GGUF, an AWQ/GPTQ int4 checkpoint: fp8 of those would be as large as 8 bits
    and hold less)."""
    if not planned_architecture(config).int8_linears:
        return f"{config.model_type}: fp8 weights are not supported for this model type yet"
    if (int4 := config.int4_quantization) is not None:
        return f"the checkpoint holds {int4.describe()} weights: serve them as q4 or auto"
    quantized = sorted(set(config.gguf_projection_types) - FLOAT_GGML_TYPES)
    if quantized:
        return (
            f"the GGUF's projections are {', '.join(quantized)} blocks, not floats: serve them "
            "as auto (q4 for Q4_1), int8 or none"
        )
    return None


def _fp8_weight_bytes(config: ModelConfig, counts: ParamCounts, dtype_bytes: int) -> WeightBytes:
    if (error := fp8_support_error(config)) is not None:
        raise ValueError(f"--quantization fp8: {error}")
    projections = sum(
        fp8_matrix_bytes(rows, cols) for rows, cols in counts.layers_projection_shapes
    )
    kept = counts.layers - counts.layers_int8_weights
    return WeightBytes(
        embeddings=counts.embeddings * dtype_bytes,
        layers=kept * dtype_bytes + counts.layers_fp32 * FLOAT32_BYTES + projections,
        final_norm=counts.final_norm * dtype_bytes,
        lm_head=counts.lm_head * dtype_bytes,
    )


def _quantized_weight_bytes(
    config: ModelConfig, counts: ParamCounts, dtype_bytes: int, quantization: Quantization
) -> WeightBytes:
    if not planned_architecture(config).int8_linears:
        raise ValueError(
            f"{config.model_type}: {quantization} weights are not supported for this model type "
            "yet; use quantization 'none'"
        )
    if quantization == Quantization.Q4:
        if (error := q4_support_error(config)) is not None:
            raise ValueError(error)
        projections = sum(
            q4_matrix_bytes(rows, cols) for rows, cols in counts.layers_projection_shapes
        ) + input_order_bytes(config)
    else:
        projections = counts.layers_int8_weights + counts.layers_int8_rows * FLOAT32_BYTES
    hidden = config.hidden_size
    vocab_rows = counts.embeddings // hidden
    kept = counts.layers - counts.layers_int8_weights
    return WeightBytes(
        embeddings=int8_matrix_bytes(vocab_rows, hidden),
        layers=kept * dtype_bytes + counts.layers_fp32 * FLOAT32_BYTES + projections,
        final_norm=counts.final_norm * dtype_bytes,
        lm_head=int8_matrix_bytes(counts.lm_head // hidden, hidden) if counts.lm_head else 0,
    )
