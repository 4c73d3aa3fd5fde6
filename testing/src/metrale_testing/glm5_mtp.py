"""A random MTP layer appended to a saved GLM-5.3 checkpoint, as DeepSeek-V3's layout names it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

HC_SHAPES = {"fn": (3, -1), "base": (3,), "scale": (3,)}  # one stream: (2 + 1) * 1 mixes


def add_glm5_mtp_layer(path: Path, generator: torch.Generator, *, source_layer: int) -> str:
    """Append MTP layer 0 (checkpoint layer ``num_hidden_layers``) to ``path``'s
    ``model.safetensors``: ``source_layer``'s tensors (a DSA layer with its own indexer)
    renumbered and redrawn, its hyper-connections over one stream, ``enorm``, ``hnorm``,
    ``eh_proj``, ``shared_head.norm``, and copies of the embedding and head; config.json
    gets ``num_nextn_predict_layers: 1``. Returns the MTP layer's tensor prefix."""
    import torch
    from safetensors.torch import load_file, save_file

    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    text = config.get("text_config", config)
    text["num_nextn_predict_layers"] = 1
    config_file.write_text(json.dumps(config, indent=2))
    file = path / "model.safetensors"
    tensors = load_file(file)
    stack = next(n for n in tensors if ".layers.0." in n).split("layers.0.")[0]
    source, hidden = f"{stack}layers.{source_layer}.", text["hidden_size"]
    prefix = f"{stack}layers.{text['num_hidden_layers']}."
    shapes: dict[str, tuple[int, ...]] = {
        prefix + name[len(source) :]: tuple(t.shape)
        for name, t in tensors.items()
        if name.startswith(source) and ".hc_" not in name
    }
    for which in ("attn", "ffn"):
        for part, shape in HC_SHAPES.items():
            shapes[f"{prefix}hc_{which}_{part}"] = tuple(hidden if s == -1 else s for s in shape)
    for name in ("enorm", "hnorm", "shared_head.norm"):
        shapes[f"{prefix}{name}.weight"] = (hidden,)
    shapes[f"{prefix}eh_proj.weight"] = (hidden, 2 * hidden)
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        if "norm" in name or name.endswith("_scale"):
            tensors[name] = 1.0 + 0.2 * noise
        elif name.endswith(("e_score_correction_bias", "_base")):
            tensors[name] = 0.5 * noise
        else:
            tensors[name] = 0.2 * noise
    embedding = next(t for n, t in tensors.items() if n.endswith("embed_tokens.weight"))
    tensors[f"{prefix}embed_tokens.weight"] = embedding.clone()
    tensors[f"{prefix}shared_head.head.weight"] = embedding.clone()
    save_file({n: t.contiguous() for n, t in tensors.items()}, file, metadata={"format": "pt"})
    return prefix
