"""Quantize a float llama-family checkpoint to an AWQ- or GPTQ-layout int4 one: round to nearest,
or the levels GPTQ's rounding gave (:mod:`~metrale_model_arch.int4_gptq`).

The projections (``q/k/v/o_proj``, ``gate/up/down_proj`` of every layer) are quantized per group
of ``group_size`` input features and packed as :mod:`~metrale_model_arch.loading.int4_checkpoints`
reads them; every other tensor is stored as float16. Per group, asymmetric: ``s = (max - min)
/ 15`` (both clamped to include 0), ``z = round(-min / s)``; symmetric (GPTQ only): ``s = 2
max|w| / 15``, ``z = 8``; then ``q = clamp(round(w / s) + z, 0, 15)``. Without calibration (no
activation-aware scaling, no Hessian): what AWQ and GPTQ start from, in their on-disk layouts,
so their loading and serving can be measured on any float model (``benches/format_quality.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from metrale_config import Int4Method, ModelConfig
from metrale_model_arch.quantized_checkpoint import (
    DEFAULT_MAX_SHARD_BYTES,
    ShardedCheckpointWriter,
    hf_config,
)

PROJECTION = re.compile(r"model\.layers\.\d+\.(self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\.weight")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int64)
_MIN_SCALE = 1e-8


@attrs.frozen(eq=False)
class Int4Levels:
    """A weight ``(out, in)`` on its int4 grid: int64 ``values`` (levels 0..15), float16 ``scales``
    and int64 ``zeros`` ``(out, groups)``, and ``group_index (in,)`` int64, each input column's
    group (GPTQ's ``g_idx``: ``column // group_size`` unless act-order formed the groups)."""

    values: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_index: torch.Tensor

    @property
    def is_in_order(self) -> bool:
        """Whether each group is consecutive columns (``group_index`` is ``column //
        group_size``)."""
        group_size = self.values.shape[1] // self.scales.shape[1]
        in_order = torch.arange(self.values.shape[1]) // group_size
        return bool(torch.equal(self.group_index, in_order))

    def dequantized(self) -> torch.Tensor:
        """``(q - z) s``, each column by its group's, float32."""
        zeros, scales = self.zeros[:, self.group_index], self.scales[:, self.group_index]
        return (self.values - zeros).float() * scales.float()


def quantize_int4(
    weight: torch.Tensor, group_size: int, *, method: Int4Method, is_symmetric: bool = False
) -> dict[str, torch.Tensor]:
    """``weight (out, in)`` -> its ``qweight``, ``qzeros``, ``scales`` (and GPTQ's ``g_idx``)."""
    rows, cols = weight.shape
    check_int4_shape(rows, cols, group_size)
    groups = weight.detach().to(torch.float32).reshape(rows, cols // group_size, group_size)
    scales, zeros = group_grid(groups, method=method, is_symmetric=is_symmetric)
    levels = torch.round(groups / scales.float().unsqueeze(-1)) + zeros.unsqueeze(-1)
    values = levels.clamp(0, 15).to(torch.int64).reshape(rows, cols)
    group_index = torch.arange(cols) // group_size
    return pack_int4(Int4Levels(values, scales, zeros, group_index), method=method)


def check_int4_shape(rows: int, cols: int, group_size: int) -> None:
    if cols % group_size or rows % 8 or group_size % 8:
        raise ValueError(f"a ({rows}, {cols}) matrix is not whole groups of {group_size} and 8s")


def group_grid(
    groups: torch.Tensor, *, method: Int4Method, is_symmetric: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``groups (..., group_size)`` -> each group's float16 scale and int64 zero."""
    low, high = groups.amin(dim=-1).clamp(max=0), groups.amax(dim=-1).clamp(min=0)
    if is_symmetric:
        scales = (torch.maximum(-low, high) * 2 / 15).clamp(min=_MIN_SCALE).to(torch.float16)
        zeros = torch.full_like(low, 8, dtype=torch.int64)
    else:
        scales = ((high - low) / 15).clamp(min=_MIN_SCALE).to(torch.float16)
        zeros = torch.round(-low / scales.float()).clamp(0, 15).to(torch.int64)
        if method == Int4Method.GPTQ:
            zeros = zeros.clamp(min=1)  # v1 stores z - 1 in a nibble
    return scales, zeros


def pack_int4(levels: Int4Levels, *, method: Int4Method) -> dict[str, torch.Tensor]:
    """``levels`` -> the method's packed tensors (GPTQ's ``qweight`` rows in column order, each
    column's group in ``g_idx``)."""
    if method == Int4Method.AWQ:
        if not levels.is_in_order:
            raise ValueError("AWQ's groups are consecutive columns: act-order is GPTQ's")
        return {
            "qweight": _pack_last(levels.values.t(), AWQ_ORDER),
            "qzeros": _pack_last(levels.zeros.t(), AWQ_ORDER),
            "scales": levels.scales.t().contiguous(),
        }
    return {
        "qweight": _pack_last(levels.values, tuple(range(8))).t().contiguous(),
        "qzeros": _pack_last(levels.zeros.t() - 1, tuple(range(8))),
        "scales": levels.scales.t().contiguous(),
        "g_idx": levels.group_index.to(torch.int32),
    }


def _pack_last(values: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """int ``(r, 8c)`` -> int32 ``(r, c)``: nibble ``i`` holds column ``8j + order[i]``."""
    rows = values.shape[0]
    eights = values.reshape(rows, -1, 8)[:, :, list(order)]
    packed = (eights << _SHIFTS).sum(dim=-1)
    return torch.from_numpy(packed.numpy().astype(np.uint32).view(np.int32))


def write_int4_checkpoint(
    out_dir: str | Path,
    config: ModelConfig,
    weights: Iterable[tuple[str, torch.Tensor]],
    *,
    method: Int4Method,
    group_size: int,
    is_symmetric: bool = False,
    hf: Mapping[str, Any] | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    rounded: Mapping[str, Int4Levels] | None = None,
    desc_act: bool = False,
) -> Path:
    """Write ``config``'s model (``weights`` under checkpoint names, a tied head omitted) to
    ``out_dir`` as ``config.json`` and ``model.safetensors``, its projections ``method`` int4,
    the rest float16. ``hf``: the ``config.json`` fields (default: :func:`hf_config`).
    Each weight is quantized as it comes and written a shard of ``max_shard_bytes`` at a time:
    one float weight and one shard are held. A projection in ``rounded`` (GPTQ's rounding,
    :mod:`~metrale_model_arch.int4_gptq`) is written as its levels there, the others rounded to
    nearest. ``desc_act``: GPTQ's, whether a projection's groups may be any columns (act-order)."""
    if method == Int4Method.AWQ and (is_symmetric or desc_act):
        raise ValueError(
            "AWQ has zero points and groups in order: is_symmetric, desc_act are GPTQ's"
        )
    writer = ShardedCheckpointWriter(Path(out_dir), max_shard_bytes)
    for name, tensor in weights:
        if config.tie_word_embeddings and name == "lm_head.weight":
            continue
        if PROJECTION.fullmatch(name):
            prefix = name.removesuffix(".weight")
            levels = None if rounded is None else rounded.get(name)
            if levels is None:
                parts = quantize_int4(tensor, group_size, method=method, is_symmetric=is_symmetric)
            elif not (desc_act or levels.is_in_order):
                raise ValueError(f"{name}: groups out of column order need desc_act")
            else:
                parts = pack_int4(levels, method=method)
            for part, packed in parts.items():
                writer.add(f"{prefix}.{part}", packed)
        else:
            writer.add(name, tensor.to(torch.float16))
    quantization: dict[str, Any] = {
        "quant_method": str(method),
        "bits": 4,
        "group_size": group_size,
    }
    if method == Int4Method.AWQ:
        quantization.update(zero_point=True, version="gemm")
    else:
        quantization.update(sym=is_symmetric, desc_act=desc_act, checkpoint_format="gptq")
    fields = {**(hf_config(config) if hf is None else hf), "torch_dtype": "float16"}
    writer.finish(fields, quantization)
    return writer.out
