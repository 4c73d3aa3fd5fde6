"""Quantize a float checkpoint to an FP8 e4m3 one, in the public layouts: round to nearest, or
the values GPTQ's rounding gave (:func:`gptq_fp8`).

Each weight of a linear layer inside the decoder layers (attention, MLP, routed and shared
experts; not the norms, not the MoE router ``mlp.gate``) becomes float8_e4m3fn ``q`` with a
scale ``s`` per tensor, per output channel or per ``R x C`` block (edge blocks partial):
``s = max|w| / 448`` over what it covers, ``q = fp8(w / s)`` (round to nearest, saturated at
e4m3's 448). The layouts (:class:`Fp8Layout`), as
:mod:`~metrale_model_arch.loading.fp8_checkpoints` reads them:

- ``fp8`` by block: DeepSeek-V3's (``quant_method: fp8``, ``fmt: e4m3``, ``weight_block_size``),
  the scales ``weight_scale_inv`` float32 ``(ceil(out / R), ceil(in / C))``;
  :data:`BLOCK_128` is its 128 x 128 blocks;
- ``fp8`` per tensor (and with static activations, ``input_scale``): vLLM's, one float32
  ``weight_scale`` of shape ``()``;
- ``compressed-tensors`` per channel, tensor or block: ``float-quantized``, ``weight_scale``
  ``(out, 1)``, ``(1,)`` or blocks, in ``scale_dtype``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from metrale_model_arch.gptq import gptq_round
from metrale_model_arch.quantized_checkpoint import (
    DEFAULT_MAX_SHARD_BYTES,
    ShardedCheckpointWriter,
)

E4M3_MAX = 448.0
QUANTIZED = re.compile(r"model\.layers\.\d+\..*\.weight")
NOT_QUANTIZED = re.compile(r".*(norm\.weight|\.mlp\.gate\.weight)")
# The static activation scale written beside each weight (a layout with static activations).
STATIC_INPUT_SCALE = 0.02
_MIN_SCALE = 1e-12


@attrs.frozen(kw_only=True)
class Fp8Layout:
    """``method``: ``fp8`` or ``compressed-tensors``; ``granularity``: what one scale covers,
    ``tensor``, ``channel`` or ``block`` (``block``: its rows and columns)."""

    method: str
    granularity: str
    block: tuple[int, int] | None = None
    static_activations: bool = False
    scale_dtype: str = "float32"

    @property
    def scale_name(self) -> str:
        """DeepSeek's block layout names the scale ``weight_scale_inv`` (a multiplier
        nonetheless), every other ``weight_scale``."""
        is_block = self.method == "fp8" and self.granularity == "block"
        return "weight_scale_inv" if is_block else "weight_scale"


BLOCK_128 = Fp8Layout(method="fp8", granularity="block", block=(128, 128))


def quantization_config(layout: Fp8Layout) -> dict[str, Any]:
    """The layout's ``quantization_config``, as its tools write it."""
    if layout.method == "fp8":
        config: dict[str, Any] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "static" if layout.static_activations else "dynamic",
            "modules_to_not_convert": ["lm_head"],
        }
        if layout.block is not None:
            config["weight_block_size"] = list(layout.block)
        return config
    weights = {"num_bits": 8, "type": "float", "strategy": layout.granularity,
               "symmetric": True, "dynamic": False, "group_size": None,
               "block_structure": list(layout.block) if layout.block else None}  # fmt: skip
    activations = {"num_bits": 8, "type": "float", "symmetric": True}
    if layout.static_activations:
        activations.update(strategy="tensor", dynamic=False)
    else:
        activations.update(strategy="token", dynamic=True)
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": activations,
                "output_activations": None,
                "format": "float-quantized",
            }
        },
        "ignore": ["lm_head", "re:.*mlp.gate$"],
        "kv_cache_scheme": None,
        "sparsity_config": {},
    }


def scale_index(
    rows: int, cols: int, layout: Fp8Layout
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each element's scale row and column (``None``: one scale for the tensor)."""
    if layout.granularity == "tensor":
        return None
    row = torch.arange(rows).unsqueeze(1).expand(rows, cols)
    if layout.granularity == "channel":
        return row, torch.zeros(rows, cols, dtype=torch.int64)
    assert layout.block is not None
    column = torch.arange(cols).unsqueeze(0).expand(rows, cols)
    return row // layout.block[0], column // layout.block[1]


def quantize_fp8(weight: torch.Tensor, layout: Fp8Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight (out, in)`` -> ``q`` float8_e4m3fn and its scale, shaped as the layout stores
    it."""
    weight = weight.detach().to(torch.float32)
    scale, expanded = fp8_scale(weight, layout)
    return to_e4m3(weight / expanded), scale


def fp8_scale(weight: torch.Tensor, layout: Fp8Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``weight (out, in)`` -> its scale as the layout stores it, and each element's
    scale ``(out, in)`` float32."""
    rows, cols = weight.shape
    index = scale_index(rows, cols, layout)
    if index is None:
        scale = weight.abs().amax().reshape(1, 1)
    else:
        is_channel = layout.granularity == "channel"
        grid_rows, grid_cols = (rows, 1) if is_channel else _block_grid(rows, cols, layout)
        cells = (index[0] * grid_cols + index[1]).reshape(-1)
        amax = torch.zeros(grid_rows * grid_cols).scatter_reduce(
            0, cells, weight.abs().reshape(-1), "amax"
        )
        scale = amax.reshape(grid_rows, grid_cols)
    scale = (scale / E4M3_MAX).clamp(min=_MIN_SCALE).to(getattr(torch, layout.scale_dtype))
    expanded = _expand(scale.float(), rows, cols, layout)
    if layout.granularity == "tensor":
        scale = scale.reshape(()) if layout.method == "fp8" else scale.reshape(1)
    return scale, expanded


def to_e4m3(scaled: torch.Tensor) -> torch.Tensor:
    """float32 values already divided by their scale -> float8_e4m3fn, saturated."""
    return scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


@attrs.frozen(eq=False)
class Fp8Weight:
    """A weight as float8_e4m3fn ``q`` and its scale as ``layout`` stores it."""

    q: torch.Tensor
    scale: torch.Tensor
    layout: Fp8Layout

    def dequantized(self) -> torch.Tensor:
        return dequantized(self.q, self.scale, self.layout)


def gptq_fp8(
    weight: torch.Tensor, hessian: torch.Tensor, layout: Fp8Layout
) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`~metrale_model_arch.fp8_quantize.quantize_fp8`, GPTQ-rounded with ``hessian``."""
    scale, expanded = fp8_scale(weight.detach().to(torch.float32), layout)
    rounder = Fp8Rounder(expanded)
    gptq_round(weight, hessian, rounder)
    return rounder.q, scale


class Fp8Rounder:
    """One weight's e4m3 values under fixed scales, filled column by column."""

    def __init__(self, expanded_scale: torch.Tensor) -> None:
        self.expanded_scale = expanded_scale
        self.q = torch.zeros(expanded_scale.shape, dtype=torch.float8_e4m3fn)

    def round_column(self, index: int, pending: torch.Tensor) -> torch.Tensor:
        scale = self.expanded_scale[:, index]
        q = to_e4m3(pending[:, 0] / scale)
        self.q[:, index] = q
        return q.float() * scale


def dequantized(q: torch.Tensor, scale: torch.Tensor, layout: Fp8Layout) -> torch.Tensor:
    """``q * s``, every element by its own scale, in float32."""
    rows, cols = q.shape
    scale_2d = scale.float().reshape(1, 1) if layout.granularity == "tensor" else scale.float()
    return q.to(torch.float32) * _expand(scale_2d, rows, cols, layout)


def _block_grid(rows: int, cols: int, layout: Fp8Layout) -> tuple[int, int]:
    assert layout.block is not None
    return -(-rows // layout.block[0]), -(-cols // layout.block[1])


def _expand(scale: torch.Tensor, rows: int, cols: int, layout: Fp8Layout) -> torch.Tensor:
    index = scale_index(rows, cols, layout)
    if index is None:
        return scale.reshape(()).expand(rows, cols)
    return scale[index[0], index[1]]


def is_fp8_target(name: str, tensor: torch.Tensor) -> bool:
    """Whether the checkpoint tensor ``name`` is a weight the fp8 layouts quantize."""
    return (
        tensor.dim() == 2
        and QUANTIZED.fullmatch(name) is not None
        and NOT_QUANTIZED.fullmatch(name) is None
    )


def write_fp8_checkpoint(
    out_dir: str | Path,
    hf: Mapping[str, Any],
    weights: Iterable[tuple[str, torch.Tensor]],
    layout: Fp8Layout,
    *,
    float_dtype: torch.dtype | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    rounded: Mapping[str, Fp8Weight] | None = None,
) -> Path:
    """Save ``weights`` (checkpoint names) with the ``config.json`` fields ``hf`` to
    ``out_dir`` in ``layout``, the other tensors in ``float_dtype`` (default: their own; the
    config's ``torch_dtype`` says which), in files of at most ``max_shard_bytes`` (a weight
    and its scale may then be in different files). Each weight is quantized as it comes and
    written a shard at a time: one float weight and one shard are held. A weight in ``rounded``
    (GPTQ's rounding, :func:`gptq_fp8`, in ``layout``) is written as it is there, the others
    rounded to nearest."""
    writer = ShardedCheckpointWriter(Path(out_dir), max_shard_bytes)
    float_dtypes: set[torch.dtype] = set()
    for name, tensor in weights:
        if not is_fp8_target(name, tensor):
            kept = tensor if float_dtype is None else tensor.to(float_dtype)
            writer.add(name, kept)
            float_dtypes.add(kept.dtype)
            continue
        prefix = name.removesuffix(".weight")
        given = None if rounded is None else rounded.get(name)
        if given is None:
            q, scale = quantize_fp8(tensor, layout)
        elif given.layout != layout:
            raise ValueError(f"{name}: rounded in {given.layout}, written in {layout}")
        else:
            q, scale = given.q, given.scale
        writer.add(name, q)
        writer.add(f"{prefix}.{layout.scale_name}", scale)
        if layout.static_activations:
            shape = () if layout.method == "fp8" else (1,)
            writer.add(
                f"{prefix}.input_scale", torch.full(shape, STATIC_INPUT_SCALE, dtype=scale.dtype)
            )
    fields = dict(hf)
    if len(float_dtypes) == 1:
        fields["torch_dtype"] = str(float_dtypes.pop()).removeprefix("torch.")
    writer.finish(fields, quantization_config(layout))
    return writer.out
