"""Consistency checks every parsed ``ModelConfig`` passes, whatever file it came from."""

from __future__ import annotations

from metrale_config.errors import ConfigError
from metrale_config.layer_types import LayerType
from metrale_config.model_config import ModelConfig

LAYER_TYPES = frozenset(LayerType)
MLP_LAYER_TYPES = frozenset({"dense", "sparse"})
INDEXER_TYPES = frozenset({"full", "shared"})


def validate_model_config(config: ModelConfig) -> None:
    """Raise ``ConfigError`` (starting with ``config.source``) for an impossible architecture."""

    def fail(field: str, problem: str) -> ConfigError:
        return ConfigError(f"{config.source}: field '{field}' {problem}")

    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
    ):
        value = getattr(config, field)
        if value <= 0:
            raise fail(field, f"must be positive, got {value}")
    if config.num_attention_heads % config.num_key_value_heads != 0:
        raise fail(
            "num_attention_heads",
            f"({config.num_attention_heads}) must be divisible by "
            f"num_key_value_heads ({config.num_key_value_heads})",
        )
    if config.rms_norm_eps <= 0:
        raise fail("rms_norm_eps", f"must be positive, got {config.rms_norm_eps}")
    if config.sliding_window is not None and config.sliding_window <= 0:
        raise fail("sliding_window", f"must be positive, got {config.sliding_window}")
    _check_per_layer(config, "layer_types", config.layer_types, LAYER_TYPES)
    if config.moe is not None:
        moe = config.moe
        if moe.num_experts <= 0 or moe.moe_intermediate_size <= 0:
            raise fail("num_experts", "and moe_intermediate_size must be positive")
        if not 0 < moe.num_experts_per_tok <= moe.num_experts:
            raise fail(
                "num_experts_per_tok",
                f"must be between 1 and the number of experts ({moe.num_experts}), "
                f"got {moe.num_experts_per_tok}",
            )
        _check_per_layer(config, "mlp_layer_types", moe.mlp_layer_types, MLP_LAYER_TYPES)
    if config.dsa is not None:
        _check_per_layer(config, "indexer_types", config.dsa.indexer_types, INDEXER_TYPES)


def _check_per_layer(
    config: ModelConfig, field: str, values: tuple[str, ...], allowed: frozenset[str]
) -> None:
    if len(values) != config.num_hidden_layers:
        raise ConfigError(
            f"{config.source}: field '{field}' must have num_hidden_layers "
            f"({config.num_hidden_layers}) entries, got {len(values)}"
        )
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ConfigError(
            f"{config.source}: field '{field}' has unknown entries {unknown} "
            f"(allowed: {', '.join(sorted(allowed))})"
        )
