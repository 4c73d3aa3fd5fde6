"""``config.json`` → ``ModelConfig`` for the llama-like families and the dispatch on model_type."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from metrale_config.errors import ConfigError
from metrale_config.hf_fields import FieldReader
from metrale_config.hf_rope import parse_hf_rope
from metrale_config.model_config import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    ModelConfig,
    MoeConfig,
    MtpConfig,
)
from metrale_config.validation import validate_model_config

CONFIG_FILE_NAME = "config.json"


@attrs.frozen(kw_only=True)
class FamilyDefaults:
    """The transformers class defaults a family's ``config.json`` may omit."""

    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # None: hidden_size // num_attention_heads.
    head_dim: int | None = None
    # None: num_attention_heads.
    num_key_value_heads: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    sliding_window: int | None = None


_DEFAULTS = {
    "llama": FamilyDefaults(max_position_embeddings=2048, bos_token_id=1, eos_token_id=2),
    "mistral": FamilyDefaults(
        max_position_embeddings=131072,
        num_key_value_heads=8,
        bos_token_id=1,
        eos_token_id=2,
        sliding_window=4096,
    ),
    "qwen2": FamilyDefaults(
        max_position_embeddings=32768, num_key_value_heads=32, sliding_window=4096
    ),
    "qwen3": FamilyDefaults(
        max_position_embeddings=32768, head_dim=128, num_key_value_heads=32, sliding_window=4096
    ),
    "qwen3_moe": FamilyDefaults(
        max_position_embeddings=32768, num_key_value_heads=4, sliding_window=4096
    ),
    "mixtral": FamilyDefaults(
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        num_key_value_heads=8,
        bos_token_id=1,
        eos_token_id=2,
    ),
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
    from metrale_config.hf_glm5_next import parse_glm5_next

    reader = FieldReader(source=source, data=data)
    model_type = normalize_model_type(reader.string("model_type"))
    parsers: dict[str, Callable[[FieldReader, str], ModelConfig]] = {
        "llama": _parse_llama_like,
        "mistral": _parse_llama_like,
        "qwen2": _parse_llama_like,
        "qwen3": _parse_llama_like,
        "qwen3_moe": _parse_qwen3_moe,
        "mixtral": _parse_mixtral,
        "glm5_next": parse_glm5_next,
        "glm5_next_text": parse_glm5_next,
    }
    parser = parsers.get(model_type)
    if parser is None:
        supported = ", ".join(sorted(parsers))
        raise ConfigError(
            f"{source}: unsupported model_type '{model_type}'; supported: {supported}"
        )
    config = parser(reader, model_type)
    validate_model_config(config)
    return config


def parse_common(reader: FieldReader, model_type: str) -> ModelConfig:
    """The fields every decoder-only family shares, with ``_DEFAULTS[model_type]`` filled in."""
    defaults = _DEFAULTS[model_type]
    hidden_size = reader.integer("hidden_size")
    num_attention_heads = reader.integer("num_attention_heads")
    if num_attention_heads <= 0:
        raise reader.error("num_attention_heads", f"must be positive, got {num_attention_heads}")
    head_dim = reader.optional_integer("head_dim", defaults.head_dim)
    num_key_value_heads = reader.optional_integer(
        "num_key_value_heads", defaults.num_key_value_heads
    )
    max_position_embeddings = reader.integer(
        "max_position_embeddings", defaults.max_position_embeddings
    )
    rope_theta, rope_scaling = parse_hf_rope(
        reader,
        default_theta=defaults.rope_theta,
        max_position_embeddings=max_position_embeddings,
    )
    num_hidden_layers = reader.integer("num_hidden_layers")
    return ModelConfig(
        source=reader.source,
        model_type=model_type,
        architectures=reader.optional_string_list("architectures") or (),
        vocab_size=reader.integer("vocab_size"),
        hidden_size=hidden_size,
        intermediate_size=reader.integer("intermediate_size"),
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=(
            num_attention_heads if num_key_value_heads is None else num_key_value_heads
        ),
        head_dim=head_dim if head_dim is not None else hidden_size // num_attention_heads,
        hidden_act=reader.string("hidden_act", "silu"),
        rms_norm_eps=reader.number("rms_norm_eps", defaults.rms_norm_eps),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=reader.boolean("tie_word_embeddings", False),
        bos_token_id=reader.optional_integer("bos_token_id", defaults.bos_token_id),
        eos_token_ids=_eos_token_ids(reader, defaults.eos_token_id),
        pad_token_id=reader.optional_integer("pad_token_id"),
        torch_dtype=parse_dtype(reader),
        layer_types=(FULL_ATTENTION,) * num_hidden_layers,
        quantization_method=parse_quantization_method(reader),
    )


def _eos_token_ids(reader: FieldReader, default: int | None) -> tuple[int, ...]:
    if not reader.has("eos_token_id"):
        return () if default is None else (default,)
    return reader.optional_integer_list("eos_token_id") or ()


def parse_dtype(reader: FieldReader) -> str | None:
    """``dtype`` (transformers 5) or ``torch_dtype`` (older saves)."""
    if reader.is_set("dtype"):
        return reader.string("dtype")
    return reader.optional_string("torch_dtype")


def parse_quantization_method(reader: FieldReader) -> str | None:
    quantization = reader.child("quantization_config")
    return None if quantization is None else quantization.optional_string("quant_method")


def parse_mtp(
    reader: FieldReader, layer_type_names: Mapping[str, str] | None = None
) -> MtpConfig | None:
    """``num_nextn_predict_layers`` / ``num_mtp_layers`` (+ ``mtp_layer_types``); None when 0."""
    name = (
        "num_nextn_predict_layers"
        if reader.is_set("num_nextn_predict_layers")
        else "num_mtp_layers"
    )
    num_layers = reader.optional_integer(name) or 0
    if num_layers < 0:
        raise reader.error(name, f"must not be negative, got {num_layers}")
    if num_layers == 0:
        return None
    raw_types = reader.optional_string_list("mtp_layer_types") or ()
    if layer_type_names is not None:
        raw_types = tuple(
            map_layer_type(reader, "mtp_layer_types", kind, layer_type_names) for kind in raw_types
        )
    return MtpConfig(num_layers=num_layers, layer_types=raw_types)


def map_layer_type(reader: FieldReader, field: str, kind: str, names: Mapping[str, str]) -> str:
    mapped = names.get(kind)
    if mapped is None:
        known = ", ".join(sorted(names))
        raise reader.error(field, f"has unknown layer type '{kind}' (known: {known})")
    return mapped


_SLIDING_LAYER_TYPES = {FULL_ATTENTION: FULL_ATTENTION, SLIDING_ATTENTION: SLIDING_ATTENTION}


def _attention_layout(
    reader: FieldReader, model_type: str, num_layers: int
) -> tuple[int | None, tuple[str, ...]]:
    """``(sliding_window, layer_types)`` the way each transformers class derives them."""
    default_window = _DEFAULTS[model_type].sliding_window
    if model_type in ("mistral", "mixtral"):
        window = reader.optional_integer("sliding_window", default_window)
        kind = FULL_ATTENTION if window is None else SLIDING_ATTENTION
        return window, (kind,) * num_layers
    if model_type == "llama":
        return None, (FULL_ATTENTION,) * num_layers
    uses_window = reader.boolean("use_sliding_window", False)
    window = reader.optional_integer("sliding_window", default_window) if uses_window else None
    if model_type == "qwen3_moe":
        kind = FULL_ATTENTION if window is None else SLIDING_ATTENTION
        return window, (kind,) * num_layers
    declared = reader.optional_string_list("layer_types")
    if declared is not None:
        layer_types = tuple(
            map_layer_type(reader, "layer_types", kind, _SLIDING_LAYER_TYPES) for kind in declared
        )
    else:
        max_window_layers = reader.integer("max_window_layers", 28)
        layer_types = tuple(
            SLIDING_ATTENTION if window is not None and i >= max_window_layers else FULL_ATTENTION
            for i in range(num_layers)
        )
    if window is None:
        # transformers runs a "sliding_attention" layer with no window as full attention.
        layer_types = (FULL_ATTENTION,) * len(layer_types)
    return window, layer_types


def _parse_llama_like(reader: FieldReader, model_type: str) -> ModelConfig:
    config = parse_common(reader, model_type)
    sliding_window, layer_types = _attention_layout(reader, model_type, config.num_hidden_layers)
    if model_type in ("llama", "qwen3", "qwen3_moe"):
        qkv_bias = o_proj_bias = reader.boolean("attention_bias", False)
    elif model_type == "qwen2":
        qkv_bias, o_proj_bias = True, False
    else:
        qkv_bias = o_proj_bias = False
    return attrs.evolve(
        config,
        sliding_window=sliding_window,
        layer_types=layer_types,
        qkv_bias=qkv_bias,
        o_proj_bias=o_proj_bias,
        mlp_bias=reader.boolean("mlp_bias", False) if model_type == "llama" else False,
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        mtp=parse_mtp(reader),
    )


def _parse_qwen3_moe(reader: FieldReader, model_type: str) -> ModelConfig:
    num_layers = reader.integer("num_hidden_layers")
    name = "num_experts" if reader.has("num_experts") else "num_local_experts"
    num_experts = reader.integer(name, 128)
    sparse_step = reader.integer("decoder_sparse_step", 1)
    if sparse_step <= 0:
        raise reader.error("decoder_sparse_step", f"must be positive, got {sparse_step}")
    dense_layers = set(reader.optional_integer_list("mlp_only_layers") or ())
    mlp_layer_types = tuple(
        "sparse"
        if i not in dense_layers and num_experts > 0 and (i + 1) % sparse_step == 0
        else "dense"
        for i in range(num_layers)
    )
    moe_intermediate_size = reader.integer("moe_intermediate_size", 768)
    if "dense" not in mlp_layer_types and not reader.has("intermediate_size"):
        # Only dense layers read intermediate_size; keep the transformers default.
        reader = attrs.evolve(reader, data={**reader.data, "intermediate_size": 6144})
    config = _parse_llama_like(reader, model_type)
    moe = MoeConfig(
        num_experts=num_experts,
        num_experts_per_tok=reader.integer("num_experts_per_tok", 8),
        moe_intermediate_size=moe_intermediate_size,
        norm_topk_prob=reader.boolean("norm_topk_prob", False),
        mlp_layer_types=mlp_layer_types,
    )
    return attrs.evolve(config, moe=moe)


def _parse_mixtral(reader: FieldReader, model_type: str) -> ModelConfig:
    config = _parse_llama_like(reader, model_type)
    name = "num_local_experts" if reader.has("num_local_experts") else "num_experts"
    moe = MoeConfig(
        num_experts=reader.integer(name, 8),
        num_experts_per_tok=reader.integer("num_experts_per_tok", 2),
        moe_intermediate_size=config.intermediate_size,
        norm_topk_prob=True,
        mlp_layer_types=("sparse",) * config.num_hidden_layers,
    )
    return attrs.evolve(config, moe=moe)
