"""``config.json`` → ``ModelConfig``: read the file, dispatch on ``model_type``, validate."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from metrale_config.errors import ConfigError
from metrale_config.fields import FieldReader
from metrale_config.hf.deepseek import parse_deepseek
from metrale_config.hf.dense_families import (
    parse_gemma2,
    parse_gemma3_text,
    parse_granite,
    parse_olmo2,
    parse_phi3,
    parse_smollm3,
)
from metrale_config.hf.fp8_quantization import parse_fp8_quantization
from metrale_config.hf.gemma3 import parse_gemma3
from metrale_config.hf.glm5_next import parse_glm5_next
from metrale_config.hf.gpt_oss import parse_gpt_oss
from metrale_config.hf.kimi_linear import parse_kimi_linear
from metrale_config.hf.llama_like import parse_llama_like
from metrale_config.hf.moe import parse_glm4_moe, parse_mixtral, parse_qwen3_moe
from metrale_config.hf.quantization import parse_int4_quantization
from metrale_config.hf.qwen2_5_vl import parse_qwen2_5_vl
from metrale_config.hf.qwen3_next import parse_qwen3_next
from metrale_config.model_config import ModelConfig
from metrale_config.validation import validate_model_config

CONFIG_FILE_NAME = "config.json"

_PARSERS: Mapping[str, Callable[[FieldReader, str], ModelConfig]] = {
    "llama": parse_llama_like,
    "mistral": parse_llama_like,
    "qwen2": parse_llama_like,
    "qwen3": parse_llama_like,
    "qwen3_moe": parse_qwen3_moe,
    "mixtral": parse_mixtral,
    "glm4_moe": parse_glm4_moe,
    "deepseek_v2": parse_deepseek,
    "deepseek_v3": parse_deepseek,
    "deepseek_v32": parse_deepseek,
    "kimi_linear": parse_kimi_linear,
    "glm5_next": parse_glm5_next,
    "glm5_next_text": parse_glm5_next,
    "olmo2": parse_olmo2,
    "granite": parse_granite,
    "smollm3": parse_smollm3,
    "phi3": parse_phi3,
    "gemma2": parse_gemma2,
    "gemma3": parse_gemma3,
    "gemma3_text": parse_gemma3_text,
    "gpt_oss": parse_gpt_oss,
    "qwen2_5_vl": parse_qwen2_5_vl,
    "qwen3_next": parse_qwen3_next,
}


def normalize_model_type(model_type: str) -> str:
    """``Qwen3-MoE`` → ``qwen3_moe``: lower case, ``-`` and ``.`` become ``_``."""
    return model_type.lower().replace("-", "_").replace(".", "_")


def model_config_from_hf_file(path: str | os.PathLike[str]) -> ModelConfig:
    """Read ``path`` (a ``config.json`` or a directory holding one) and parse it."""
    file_path = Path(path)
    if file_path.is_dir():
        file_path = file_path / CONFIG_FILE_NAME
    source = f"{CONFIG_FILE_NAME} at {file_path}"
    try:
        text = file_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot be read: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: must hold a JSON object, got {type(data).__name__}")
    return model_config_from_hf_dict(data, source=source)


def model_config_from_hf_dict(data: Mapping[str, object], *, source: str) -> ModelConfig:
    """Parse a loaded ``config.json`` object; every error message starts with ``source``."""
    reader = FieldReader(source=source, data=data)
    model_type = normalize_model_type(reader.string("model_type"))
    parser = _PARSERS.get(model_type)
    if parser is None:
        supported = ", ".join(sorted(_PARSERS))
        raise ConfigError(
            f"{source}: unsupported model_type '{model_type}'; supported: {supported}"
        )
    config = parser(reader, model_type)
    if (int4 := parse_int4_quantization(reader)) is not None:
        config = attrs.evolve(config, int4_quantization=int4)
    if (fp8 := parse_fp8_quantization(reader)) is not None:
        config = attrs.evolve(config, fp8_quantization=fp8)
    validate_model_config(config)
    return config
