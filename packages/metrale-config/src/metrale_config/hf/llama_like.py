"""``config.json`` → ``ModelConfig`` for the llama-like families: llama, mistral, qwen2, qwen3.

``parse_common`` also serves the MoE families built on them (qwen3_moe, mixtral).
"""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.hf.common import (
    map_layer_type,
    parse_dtype,
    parse_eos_token_ids,
    parse_mtp,
    parse_quantization_method,
)
from metrale_config.hf.rope import parse_hf_rope
from metrale_config.layer_types import LayerType
from metrale_config.model_config import ModelConfig

FULL = LayerType.FULL_ATTENTION
SLIDING = LayerType.SLIDING_ATTENTION


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
    tie_word_embeddings: bool = False
    pad_token_id: int | None = None


DEFAULTS = {
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
    "qwen3_next": FamilyDefaults(
        max_position_embeddings=32768, head_dim=256, num_key_value_heads=2
    ),
    "mixtral": FamilyDefaults(
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        num_key_value_heads=8,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "glm4_moe": FamilyDefaults(
        max_position_embeddings=131072, rms_norm_eps=1e-5, num_key_value_heads=8
    ),
    "deepseek_v2": FamilyDefaults(max_position_embeddings=2048, bos_token_id=1, eos_token_id=2),
    "deepseek_v3": FamilyDefaults(max_position_embeddings=4096, bos_token_id=0, eos_token_id=1),
    "deepseek_v32": FamilyDefaults(max_position_embeddings=163840, bos_token_id=0, eos_token_id=1),
    "olmo2": FamilyDefaults(
        max_position_embeddings=2048, rms_norm_eps=1e-5, eos_token_id=50279, pad_token_id=1
    ),
    "granite": FamilyDefaults(max_position_embeddings=2048, bos_token_id=1, eos_token_id=2),
    "smollm3": FamilyDefaults(
        max_position_embeddings=32768,
        rope_theta=2000000.0,
        num_key_value_heads=4,
        bos_token_id=128000,
        eos_token_id=128001,
        pad_token_id=128004,
        tie_word_embeddings=True,
    ),
    "phi3": FamilyDefaults(
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=32000,
        pad_token_id=32000,
    ),
    "gemma2": FamilyDefaults(
        max_position_embeddings=8192,
        head_dim=256,
        num_key_value_heads=4,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
        sliding_window=4096,
        tie_word_embeddings=True,
    ),
    "gemma3_text": FamilyDefaults(
        max_position_embeddings=131072,
        rope_theta=1000000.0,
        head_dim=256,
        num_key_value_heads=4,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
        sliding_window=4096,
        tie_word_embeddings=True,
    ),
    "gpt_oss": FamilyDefaults(
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=150000.0,
        head_dim=64,
        num_key_value_heads=8,
        sliding_window=128,
    ),
    "qwen2_5_vl": FamilyDefaults(
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        num_key_value_heads=8,
        bos_token_id=151643,
        eos_token_id=151645,
        sliding_window=4096,
    ),
}

_SLIDING_LAYER_TYPES = {FULL.value: FULL, SLIDING.value: SLIDING}


def parse_common(reader: FieldReader, model_type: str) -> ModelConfig:
    """The fields every decoder-only family shares, with ``DEFAULTS[model_type]`` filled in."""
    defaults = DEFAULTS[model_type]
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
        tie_word_embeddings=reader.boolean("tie_word_embeddings", defaults.tie_word_embeddings),
        bos_token_id=reader.optional_integer("bos_token_id", defaults.bos_token_id),
        eos_token_ids=parse_eos_token_ids(reader, defaults.eos_token_id),
        pad_token_id=reader.optional_integer("pad_token_id", defaults.pad_token_id),
        torch_dtype=parse_dtype(reader),
        layer_types=(FULL,) * num_hidden_layers,
        quantization_method=parse_quantization_method(reader),
    )


def _attention_layout(
    reader: FieldReader, model_type: str, num_layers: int
) -> tuple[int | None, tuple[LayerType, ...]]:
    """``(sliding_window, layer_types)`` the way each transformers class derives them."""
    default_window = DEFAULTS[model_type].sliding_window
    if model_type in ("mistral", "mixtral"):
        window = reader.optional_integer("sliding_window", default_window)
        return window, (FULL if window is None else SLIDING,) * num_layers
    if model_type == "llama":
        return None, (FULL,) * num_layers
    uses_window = reader.boolean("use_sliding_window", False)
    window = reader.optional_integer("sliding_window", default_window) if uses_window else None
    if model_type == "qwen3_moe":
        return window, (FULL if window is None else SLIDING,) * num_layers
    declared = reader.optional_string_list("layer_types")
    if declared is not None:
        layer_types = tuple(
            map_layer_type(reader, "layer_types", kind, _SLIDING_LAYER_TYPES) for kind in declared
        )
    else:
        max_window_layers = reader.integer("max_window_layers", 28)
        layer_types = tuple(
            SLIDING if window is not None and i >= max_window_layers else FULL
            for i in range(num_layers)
        )
    if window is None:
        # transformers runs a "sliding_attention" layer with no window as full attention.
        layer_types = (FULL,) * len(layer_types)
    return window, layer_types


def parse_llama_like(reader: FieldReader, model_type: str) -> ModelConfig:
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
