"""FP8 e4m3 checkpoints of float ones for the tests, written by our own quantizer
(:mod:`metrale_model_arch.fp8_quantize`) in each public layout (``LAYOUTS``: blocks of odd
sizes, so edge blocks are partial), and the weights each layout says it holds.

The expected weights (:func:`convert_to_fp8`'s result) are read back from the written files and
computed apart from the loader: each element's scale gathered by its own row and column index.
Imported by the tests that use it (the plugin does not: it imports torch).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from metrale_model_arch.fp8_quantize import Fp8Layout, dequantized, write_fp8_checkpoint
from metrale_model_arch.quantized_checkpoint import CHECKPOINT_FILES, CONFIG_FILE

LAYOUTS = {
    "fp8-block": Fp8Layout(method="fp8", granularity="block", block=(32, 48)),
    "fp8-tensor": Fp8Layout(method="fp8", granularity="tensor"),
    "fp8-tensor-static": Fp8Layout(method="fp8", granularity="tensor", static_activations=True),
    "ct-channel": Fp8Layout(method="compressed-tensors", granularity="channel"),
    "ct-channel-static": Fp8Layout(
        method="compressed-tensors",
        granularity="channel",
        static_activations=True,
        scale_dtype="bfloat16",
    ),
    "ct-tensor": Fp8Layout(method="compressed-tensors", granularity="tensor"),
    "ct-block": Fp8Layout(method="compressed-tensors", granularity="block", block=(48, 32)),
}
SCALE_SUFFIXES = (".weight_scale", ".weight_scale_inv", ".input_scale")


def convert_to_fp8(
    source: Path, target: Path, layout: Fp8Layout, *, max_shard_bytes: int | None = None
) -> dict[str, torch.Tensor]:
    """The float checkpoint in ``source`` (one ``model.safetensors``) written to ``target`` in
    ``layout`` (its other files, the tokenizer's, copied along; in shards of ``max_shard_bytes``
    when given). Returns every weight as the
    layout says it is, in float32 under the float checkpoint's names."""
    hf = json.loads((source / CONFIG_FILE).read_text())
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and item.name not in CHECKPOINT_FILES:
            shutil.copy(item, target / item.name)
    tensors = load_file(str(source / "model.safetensors"))
    shards = {} if max_shard_bytes is None else {"max_shard_bytes": max_shard_bytes}
    write_fp8_checkpoint(target, hf, tensors.items(), layout, **shards)
    stored: dict[str, torch.Tensor] = {}
    for path in sorted(target.glob("*.safetensors")):
        stored.update(load_file(str(path)))
    expected = {}
    for name, tensor in stored.items():
        if name.endswith(SCALE_SUFFIXES):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            scale = stored[f"{name.removesuffix('.weight')}.{layout.scale_name}"]
            expected[name] = dequantized(tensor, scale, layout)
        else:
            expected[name] = tensor.to(torch.float32)
    return expected
