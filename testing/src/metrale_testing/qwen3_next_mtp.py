"""A tiny random Qwen3-Next checkpoint (transformers' save), with random MTP weights appended as
Qwen3-Next names them (``mtp.*``), as its released checkpoints carry them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# The predictor's own weights beside its layers: (hidden,) norms and fc (hidden, 2 * hidden).
MTP_NORMS = ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight")
MTP_FC = "mtp.fc.weight"


def save_tiny_qwen3_next(path: Path, seed: int = 0, **kwargs: Any) -> Any:
    """Save a random ``Qwen3NextForCausalLM`` of ``Qwen3NextConfig(**kwargs)`` (safetensors, no
    MTP weights: transformers drops them); returns the transformers model. Every parameter is
    drawn anew, the ``(1 + w)`` norms (all but the Gated DeltaNet's gated one) near 0, as
    checkpoints hold them."""
    import torch
    import transformers

    from metrale_testing.checkpoints import randomize_weights

    hf_model = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**kwargs))
    generator = torch.Generator().manual_seed(seed)
    randomize_weights(hf_model, generator)
    with torch.no_grad():
        for name, weight in hf_model.named_parameters():
            if "norm" in name and "linear_attn" not in name:
                weight.copy_(0.2 * torch.randn(weight.shape, generator=generator))
    hf_model.eval()
    hf_model.save_pretrained(path, safe_serialization=True)
    return hf_model


def add_qwen3_next_mtp(
    path: Path, generator: torch.Generator, *, source_layer: int, num_layers: int = 1
) -> None:
    """Append ``num_layers`` random MTP layers to ``path``'s ``model.safetensors``: each
    ``mtp.layers.{k}.*`` shaped as stack layer ``source_layer`` (a full-attention layer whose
    FFN is the MTP layers'), and the predictor's ``fc`` and three norms; every value
    ``0.2 * noise`` (the norms are ``(1 + w)`` norms). config.json names no MTP count for one
    layer (as Qwen3-Next's own does not: one is the default), else ``num_nextn_predict_layers``."""
    import torch
    from safetensors.torch import load_file, save_file

    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    if config["layer_types"][source_layer] != "full_attention":
        raise ValueError(f"layer {source_layer} is not a full-attention layer")
    if num_layers != 1:
        config["num_nextn_predict_layers"] = num_layers
        config_file.write_text(json.dumps(config, indent=2))
    file = path / "model.safetensors"
    tensors = load_file(file)
    hidden = config["hidden_size"]
    source = f"model.layers.{source_layer}."
    shapes: dict[str, tuple[int, ...]] = {name: (hidden,) for name in MTP_NORMS}
    shapes[MTP_FC] = (hidden, 2 * hidden)
    for k in range(num_layers):
        for name, tensor in tensors.items():
            if name.startswith(source):
                shapes[f"mtp.layers.{k}.{name[len(source) :]}"] = tuple(tensor.shape)
    for name, shape in shapes.items():
        tensors[name] = 0.2 * torch.randn(shape, generator=generator)
    save_file({n: t.contiguous() for n, t in tensors.items()}, file, metadata={"format": "pt"})
