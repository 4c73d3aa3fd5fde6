"""FP8 e4m3 checkpoints written from float ones, in the public layouts, by our own quantizer.

Each weight of a linear layer inside the decoder layers (attention, MLP, routed and shared
experts; not the norms, not the MoE router ``mlp.gate``) becomes float8_e4m3fn ``q`` with a
scale ``s`` per tensor, per output channel or per ``R x C`` block (edge blocks partial):
``s = max|w| / 448`` over what it covers, ``q = fp8(w / s)`` (round to nearest, saturated at
e4m3's 448). The layouts (``LAYOUTS``):

- ``fp8-block``: DeepSeek-V3's (``quant_method: fp8``, ``fmt: e4m3``, ``weight_block_size``),
  the scales ``weight_scale_inv`` float32 ``(ceil(out / R), ceil(in / C))``;
- ``fp8-tensor`` (and ``-static``, with ``input_scale``): vLLM's per-tensor ``fp8``, one float32
  ``weight_scale`` of shape ``()``;
- ``ct-channel``, ``ct-tensor``, ``ct-block`` (and ``ct-channel-static``): compressed-tensors'
  ``float-quantized``, ``weight_scale`` ``(out, 1)``, ``(1,)`` or blocks, in ``scale_dtype``.

The expected weights (``dequantized``) are computed here apart from the loader: each element's
scale gathered by its own row and column index. Everything heavy is imported inside the helpers
(see ``metrale_testing``).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

E4M3_MAX = 448.0
QUANTIZED = re.compile(r"model\.layers\.\d+\..*\.weight")
NOT_QUANTIZED = re.compile(r".*(norm\.weight|\.mlp\.gate\.weight)")
CHECKPOINT_FILES = ("model.safetensors", "model.safetensors.index.json", "config.json")


@dataclass(frozen=True)
class Fp8Layout:
    method: str  # "fp8" or "compressed-tensors"
    granularity: str  # "tensor", "channel" or "block"
    block: tuple[int, int] | None = None
    static_activations: bool = False
    scale_dtype: str = "float32"


LAYOUTS = {
    "fp8-block": Fp8Layout("fp8", "block", (32, 48)),
    "fp8-tensor": Fp8Layout("fp8", "tensor"),
    "fp8-tensor-static": Fp8Layout("fp8", "tensor", static_activations=True),
    "ct-channel": Fp8Layout("compressed-tensors", "channel"),
    "ct-channel-static": Fp8Layout(
        "compressed-tensors", "channel", static_activations=True, scale_dtype="bfloat16"
    ),
    "ct-tensor": Fp8Layout("compressed-tensors", "tensor"),
    "ct-block": Fp8Layout("compressed-tensors", "block", (48, 32)),
}


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
    activations = (
        {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}
        if layout.static_activations
        else {
            "num_bits": 8,
            "type": "float",
            "strategy": "token",
            "symmetric": True,
            "dynamic": True,
        }
    )
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
    import torch

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
    import torch

    rows, cols = weight.shape
    weight = weight.detach().to(torch.float32)
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
    scale = (scale / E4M3_MAX).clamp(min=1e-12).to(getattr(torch, layout.scale_dtype))
    expanded = _expand(scale.float(), rows, cols, layout)
    q = (weight / expanded).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    if layout.granularity == "tensor":
        scale = scale.reshape(()) if layout.method == "fp8" else scale.reshape(1)
    return q, scale


def dequantized(q: torch.Tensor, scale: torch.Tensor, layout: Fp8Layout) -> torch.Tensor:
    """``q * s``, every element by its own scale, in float32."""
    import torch

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


def is_quantized(name: str, tensor: torch.Tensor) -> bool:
    return (
        tensor.dim() == 2
        and QUANTIZED.fullmatch(name) is not None
        and NOT_QUANTIZED.fullmatch(name) is None
    )


def write_fp8_checkpoint(
    path: Path,
    hf_config: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
    layout: Fp8Layout,
    *,
    num_shards: int = 1,
) -> dict[str, torch.Tensor]:
    """Save ``tensors`` (checkpoint names) with ``hf_config`` to ``path`` in ``layout`` (the
    other tensors in their own dtype), over ``num_shards`` files taking the sorted names in
    turn (a weight and its scale then in different files). Returns every weight as the layout
    says it is, in float32 under the float checkpoint's names."""
    import torch
    from safetensors.torch import save_file

    stored: dict[str, torch.Tensor] = {}
    expected: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if not is_quantized(name, tensor):
            stored[name] = tensor.contiguous()
            expected[name] = tensor.to(torch.float32)
            continue
        prefix = name.removesuffix(".weight")
        q, scale = quantize_fp8(tensor, layout)
        scale_name = "weight_scale_inv" if layout.granularity == "block" and (
            layout.method == "fp8"
        ) else "weight_scale"  # fmt: skip
        stored[name], stored[f"{prefix}.{scale_name}"] = q, scale
        if layout.static_activations:
            shape = () if layout.method == "fp8" else (1,)
            stored[f"{prefix}.input_scale"] = torch.full(shape, 0.02, dtype=scale.dtype)
        expected[name] = dequantized(q, scale, layout)
    path.mkdir(parents=True, exist_ok=True)
    names = sorted(stored)
    if num_shards == 1:
        save_file(stored, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for shard in range(num_shards):
            filename = f"model-{shard + 1:05d}-of-{num_shards:05d}.safetensors"
            part = {name: stored[name] for name in names[shard::num_shards]}
            save_file(part, str(path / filename), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, filename))
        index = {"metadata": {}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {**hf_config, "quantization_config": quantization_config(layout)}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return expected


def convert_to_fp8(
    source: Path, target: Path, layout: Fp8Layout, *, num_shards: int = 1
) -> dict[str, torch.Tensor]:
    """:func:`write_fp8_checkpoint` of the float checkpoint in ``source`` (one
    ``model.safetensors``), its other files (tokenizer...) copied along."""
    from safetensors.torch import load_file

    tensors = load_file(str(source / "model.safetensors"))
    hf_config = json.loads((source / "config.json").read_text())
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and item.name not in CHECKPOINT_FILES:
            shutil.copy(item, target / item.name)
    return write_fp8_checkpoint(target, hf_config, tensors, layout, num_shards=num_shards)
