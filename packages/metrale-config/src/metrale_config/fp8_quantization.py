"""``Fp8Quantization``: an FP8 (e4m3) checkpoint's ``quantization_config``, as parsed.

The on-disk layouts it names are described where they are read
(``metrale_model_arch.loading.fp8_checkpoints``).
"""

from __future__ import annotations

import enum

import attrs


class Fp8Method(enum.StrEnum):
    # transformers' and vLLM's ``fp8``: DeepSeek-V3 / GLM / Qwen3 block-wise, or per tensor.
    FP8 = "fp8"
    # llm-compressor's ``compressed-tensors``, ``float-quantized`` (or ``naive-quantized``).
    COMPRESSED_TENSORS = "compressed-tensors"


class Fp8Granularity(enum.StrEnum):
    """What one weight scale covers."""

    TENSOR = "tensor"
    CHANNEL = "channel"  # one output feature (a row)
    BLOCK = "block"  # ``block_size`` rows by columns


@attrs.frozen(kw_only=True)
class Fp8Quantization:
    """float8 e4m3 weights times a float scale (``w = q * s``), in the layers' linear layers.

    ``granularities``: the scales the config declares (compressed-tensors may declare one per
    config group); ``block_size``: ``(rows, columns)`` of a block, set when BLOCK is declared.
    ``has_static_activations``: the checkpoint carries ``input_scale`` tensors (static
    activation scales), which dequantized weights do not need.
    """

    method: Fp8Method
    granularities: tuple[Fp8Granularity, ...]
    block_size: tuple[int, int] | None = None
    has_static_activations: bool = False

    @property
    def scale_name(self) -> str:
        """The scale's part name beside ``weight``: DeepSeek's block layout names it
        ``weight_scale_inv`` (a multiplier nonetheless), every other ``weight_scale``."""
        if self.method == Fp8Method.FP8 and self.block_size is not None:
            return "weight_scale_inv"
        return "weight_scale"

    def describe(self) -> str:
        """``fp8 weights (block 128x128)``: for logs and errors."""
        parts = []
        for granularity in self.granularities:
            if granularity == Fp8Granularity.BLOCK and self.block_size is not None:
                parts.append(f"block {self.block_size[0]}x{self.block_size[1]}")
            else:
                parts.append(f"per {granularity}")
        origin = "compressed-tensors " if self.method == Fp8Method.COMPRESSED_TENSORS else ""
        return f"{origin}fp8 weights ({', '.join(parts)})"
