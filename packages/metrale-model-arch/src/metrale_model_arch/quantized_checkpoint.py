"""What the int4 and fp8 writers share: a llama-family ``config.json`` from a ``ModelConfig``,
and writing the tensors, shard by shard as they come, with the config and its
``quantization_config``."""

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
# Hugging Face's save_pretrained default shard size ("5GB").
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9


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


class ShardedCheckpointWriter:
    """Writes tensors to ``out`` as they come, a safetensors file each time the next tensor
    would take the held ones past ``max_shard_bytes`` (a tensor larger than that alone gets a
    file of its own), so what is held is at most one shard. ``finish`` names the files as
    Hugging Face does (``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` with their
    index) and writes ``config.json``."""

    def __init__(self, out: Path, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> None:
        if max_shard_bytes <= 0:
            raise ValueError(f"max_shard_bytes must be positive, not {max_shard_bytes}")
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.max_shard_bytes = max_shard_bytes
        self._held: dict[str, torch.Tensor] = {}
        self._held_bytes = 0
        self._shards: list[tuple[Path, list[str]]] = []

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self._held and self._held_bytes + size > self.max_shard_bytes:
            self._flush()
        self._held[name] = tensor.contiguous()
        self._held_bytes += size

    def finish(self, hf: Mapping[str, Any], quantization: Mapping[str, Any]) -> None:
        """Writes the last shard, names the files, writes the index and ``hf`` with
        ``quantization`` as ``config.json``."""
        self._flush()
        if len(self._shards) == 1:
            self._shards[0][0].rename(self.out / SINGLE_FILE)
        else:
            weight_map = {}
            for number, (path, names) in enumerate(self._shards, start=1):
                filename = f"model-{number:05d}-of-{len(self._shards):05d}.safetensors"
                path.rename(self.out / filename)
                weight_map.update(dict.fromkeys(names, filename))
            index = {"metadata": {}, "weight_map": weight_map}
            (self.out / INDEX_FILE).write_text(json.dumps(index, indent=2))
        config = {**hf, "quantization_config": dict(quantization)}
        (self.out / CONFIG_FILE).write_text(json.dumps(config, indent=2))

    def _flush(self) -> None:
        if not self._held and self._shards:
            return
        path = self.out / f".shard-{len(self._shards):05d}.safetensors"
        save_file(self._held, str(path), metadata={"format": "pt"})
        self._shards.append((path, list(self._held)))
        self._held = {}
        self._held_bytes = 0
