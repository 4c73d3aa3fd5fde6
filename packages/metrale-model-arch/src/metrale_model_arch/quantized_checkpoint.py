"""What the int4 and fp8 writers share: a llama-family ``config.json`` from a ``ModelConfig``,
and saving the tensors with the config and its ``quantization_config``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from metrale_config import ModelConfig
from metrale_model_arch.int4_format import INT4_MODEL_TYPES

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
CHECKPOINT_FILES = (SINGLE_FILE, INDEX_FILE, CONFIG_FILE)


def hf_config(config: ModelConfig) -> dict[str, Any]:
    """``config.json`` fields of a llama-family ``config`` (no RoPE scaling)."""
    if config.model_type not in INT4_MODEL_TYPES or config.rope_scaling is not None:
        raise ValueError(f"{config.model_type}: only plain llama-family configs are written")
    return {
        "model_type": config.model_type,
        "architectures": list(config.architectures) or ["LlamaForCausalLM"],
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.qkv_bias,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_ids) or None,
        "torch_dtype": "float16",
    }


def save_checkpoint(
    out: Path,
    tensors: Mapping[str, torch.Tensor],
    hf: Mapping[str, Any],
    quantization: Mapping[str, Any],
    *,
    num_shards: int = 1,
) -> None:
    """Save ``tensors`` to ``out`` as ``model.safetensors`` (or ``num_shards`` files taking the
    sorted names in turn, with their index) and ``hf`` with ``quantization`` as
    ``config.json``."""
    out.mkdir(parents=True, exist_ok=True)
    if num_shards == 1:
        save_file(dict(tensors), str(out / SINGLE_FILE), metadata={"format": "pt"})
    else:
        names = sorted(tensors)
        weight_map = {}
        for shard in range(num_shards):
            filename = f"model-{shard + 1:05d}-of-{num_shards:05d}.safetensors"
            part = {name: tensors[name] for name in names[shard::num_shards]}
            save_file(part, str(out / filename), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, filename))
        index = {"metadata": {}, "weight_map": weight_map}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2))
    config = {**hf, "quantization_config": dict(quantization)}
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))
