"""Where ``--quantization fp8`` runs, and what the boot log says it did with the weights."""

from __future__ import annotations

import torch

from metrale_config import Fp8Granularity, ModelConfig
from metrale_kernels.reference.fp8_matmul import scaled_mm_support_error
from metrale_model_arch.memory.weights import fp8_support_error
from metrale_model_arch.registry import param_counts

# cuBLASLt's fp8 GEMMs take inner and outer sizes in multiples of 16.
CUDA_FP8_MULTIPLE = 16


def fp8_serve_error(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why ``config``'s model cannot serve fp8 weights on ``device`` with ``dtype``
    activations, or None: the model (:func:`~metrale_model_arch.memory.weights.fp8_support_error`),
    ``torch._scaled_mm`` on this device and dtype (tried), CUDA's multiples of 16."""
    if (error := fp8_support_error(config)) is not None:
        return error
    if (error := scaled_mm_support_error(device, dtype)) is not None:
        return error
    if device.type == "cuda":
        for rows, cols in param_counts(config).layers_projection_shapes:
            if rows % CUDA_FP8_MULTIPLE or cols % CUDA_FP8_MULTIPLE:
                return (
                    f"{config.model_type}: a projection of shape ({rows}, {cols}) is not in "
                    f"multiples of {CUDA_FP8_MULTIPLE}, as CUDA's fp8 matmul needs"
                )
    return None


def fp8_weights_line(config: ModelConfig, dtype: torch.dtype, device: torch.device) -> str:
    """The boot log's word on fp8 weights: where they came from, and what is not exact."""
    dtype_name = str(dtype).removeprefix("torch.")
    fp8 = config.fp8_quantization
    if fp8 is None:
        origin = "the float weights quantized per output channel at load (round to nearest)"
    elif Fp8Granularity.BLOCK in fp8.granularities:
        origin = (
            f"the checkpoint's {fp8.describe()} dequantized and requantized per output channel "
            "(lossy: the block scales are not kept)"
        )
    else:
        origin = f"the checkpoint's {fp8.describe()} kept as stored (a float32 scale per row)"
    line = (
        f"fp8 projections: {origin}; activations quantized to fp8 per token at each call "
        f"(W8A8, not exact to a W8A16 dequantized model); embeddings, head and norms in "
        f"{dtype_name}; torch._scaled_mm"
    )
    if device.type == "cpu":
        line += " (on the CPU it converts every weight at every call: slow; the gain is memory)"
    return line
