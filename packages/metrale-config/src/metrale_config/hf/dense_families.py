"""``config.json`` → ``ModelConfig`` for the dense families that depart from llama in the layer:
olmo2, granite, smollm3, phi3, gemma2 and gemma3_text.

Each reads the shared fields (``parse_common``) and sets the switches its transformers class
implies; defaults and derived schedules follow the transformers config classes.
"""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.hf.common import map_layer_type
from metrale_config.hf.llama_like import parse_common
from metrale_config.hf.rope import parse_hf_rope
from metrale_config.layer_types import LayerType
from metrale_config.model_config import ModelConfig, NormLayout
from metrale_config.rope import RopeScaling

FULL = LayerType.FULL_ATTENTION
SLIDING = LayerType.SLIDING_ATTENTION
_SLIDING_LAYER_TYPES = {FULL.value: FULL, SLIDING.value: SLIDING}
_GEMMA_ACT = "gelu_pytorch_tanh"


def _attention_bias(reader: FieldReader, config: ModelConfig) -> ModelConfig:
    bias = reader.boolean("attention_bias", False)
    return attrs.evolve(config, qkv_bias=bias, o_proj_bias=bias)


def _declared_layer_types(reader: FieldReader) -> tuple[LayerType, ...] | None:
    declared = reader.optional_string_list("layer_types")
    if declared is None:
        return None
    return tuple(
        map_layer_type(reader, "layer_types", kind, _SLIDING_LAYER_TYPES) for kind in declared
    )


def parse_olmo2(reader: FieldReader, model_type: str) -> ModelConfig:
    config = _attention_bias(reader, parse_common(reader, model_type))
    return attrs.evolve(config, norm_layout=NormLayout.POST, qk_norm=True, qk_norm_per_head=False)


def parse_granite(reader: FieldReader, model_type: str) -> ModelConfig:
    config = _attention_bias(reader, parse_common(reader, model_type))
    return attrs.evolve(
        config,
        mlp_bias=reader.boolean("mlp_bias", False),
        embedding_multiplier=reader.number("embedding_multiplier", 1.0),
        attention_scale=reader.number("attention_multiplier", 1.0),
        residual_multiplier=reader.number("residual_multiplier", 1.0),
        logits_scaling=reader.number("logits_scaling", 1.0),
    )


def parse_smollm3(reader: FieldReader, model_type: str) -> ModelConfig:
    config = _attention_bias(reader, parse_common(reader, model_type))
    num_layers = config.num_hidden_layers
    declared = reader.optional_integer_list("no_rope_layers")
    if declared is None:
        interval = reader.positive_integer("no_rope_layer_interval", 4)
        uses_rope = tuple(int((i + 1) % interval != 0) for i in range(num_layers))
    elif len(declared) != num_layers:
        raise reader.error("no_rope_layers", f"must have {num_layers} entries (one per layer)")
    else:
        uses_rope = declared
    uses_window = reader.boolean("use_sliding_window", False)
    window = reader.optional_integer("sliding_window") if uses_window else None
    layer_types = _declared_layer_types(reader) or tuple(
        SLIDING if window is not None and not uses_rope[i] else FULL for i in range(num_layers)
    )
    if window is None:
        layer_types = (FULL,) * len(layer_types)
    return attrs.evolve(
        config,
        mlp_bias=reader.boolean("mlp_bias", False),
        nope_layers=tuple(i for i, rope in enumerate(uses_rope) if not rope),
        sliding_window=window,
        layer_types=layer_types,
    )


def parse_phi3(reader: FieldReader, model_type: str) -> ModelConfig:
    config = parse_common(reader, model_type)
    params = reader.child("rope_scaling") or reader.child("rope_parameters")
    partial = reader.number("partial_rotary_factor", 1.0)
    if params is not None:
        partial = params.number("partial_rotary_factor", partial)
    scaling = config.rope_scaling
    if scaling is not None and scaling.rope_type in ("su", "yarn"):
        # transformers reads Phi-3's old "su" and "yarn" as longrope.
        data = {**(params.data if params else {}), "rope_type": "longrope"}
        _, scaling = parse_hf_rope(
            FieldReader(source=reader.source, data={"rope_scaling": data}),
            default_theta=config.rope_theta,
            max_position_embeddings=config.max_position_embeddings,
        )
    if scaling is not None and scaling.rope_type == "longrope":
        original = reader.optional_integer("original_max_position_embeddings")
        original = original or scaling.original_max_position_embeddings
        original = original or config.max_position_embeddings
        given = params.optional_number("factor") if params is not None else None
        scaling = attrs.evolve(
            scaling,
            original_max_position_embeddings=original,
            factor=given if given is not None else config.max_position_embeddings / original,
        )
    window = reader.optional_integer("sliding_window")
    return attrs.evolve(
        config,
        rope_scaling=scaling,
        partial_rotary_factor=partial,
        sliding_window=window,
        layer_types=(FULL if window is None else SLIDING,) * config.num_hidden_layers,
    )


def _parse_gemma(reader: FieldReader, model_type: str, sliding_every: int) -> ModelConfig:
    config = _attention_bias(reader, parse_common(reader, model_type))
    if reader.data.get("use_bidirectional_attention"):
        raise reader.error("use_bidirectional_attention", "is not supported (an encoder)")
    num_layers = config.num_hidden_layers
    window = reader.optional_integer("sliding_window", 4096)
    layer_types = _declared_layer_types(reader) or tuple(
        SLIDING if (i + 1) % sliding_every else FULL for i in range(num_layers)
    )
    if window is None:
        layer_types = (FULL,) * len(layer_types)
    hidden_act = reader.string("hidden_activation", _GEMMA_ACT)
    return attrs.evolve(
        config,
        hidden_act=hidden_act,
        norm_layout=NormLayout.SANDWICH,
        norm_weight_offset=1.0,
        embedding_multiplier=config.hidden_size**0.5,
        attention_scale=reader.number("query_pre_attn_scalar", 256) ** -0.5,
        sliding_window=window,
        layer_types=layer_types,
    )


def parse_gemma2(reader: FieldReader, model_type: str) -> ModelConfig:
    config = _parse_gemma(reader, model_type, 2)
    return attrs.evolve(
        config,
        attn_logit_softcapping=reader.optional_number("attn_logit_softcapping", 50.0),
        final_logit_softcapping=reader.optional_number("final_logit_softcapping", 30.0),
    )


def parse_gemma3_text(reader: FieldReader, model_type: str) -> ModelConfig:
    pattern = reader.positive_integer("sliding_window_pattern", 6)
    config = _parse_gemma(reader, model_type, pattern)
    per_type = reader.child("rope_parameters")
    theta, scaling = config.rope_theta, config.rope_scaling
    local_theta = reader.number("rope_local_base_freq", 10000.0)
    if per_type is not None and {FULL.value, SLIDING.value} & set(per_type.data):
        theta, scaling = _layer_type_rope(per_type, FULL.value, config, 1000000.0)
        local_theta, local_scaling = _layer_type_rope(per_type, SLIDING.value, config, local_theta)
        if local_scaling is not None:
            raise per_type.error(SLIDING.value, "must be plain RoPE (rope_type default)")
    return attrs.evolve(
        config,
        rope_theta=theta,
        rope_scaling=scaling,
        local_rope_theta=local_theta,
        qk_norm=True,
        attn_logit_softcapping=reader.optional_number("attn_logit_softcapping"),
        final_logit_softcapping=reader.optional_number("final_logit_softcapping"),
    )


def _layer_type_rope(
    per_type: FieldReader, layer_type: str, config: ModelConfig, default_theta: float
) -> tuple[float, RopeScaling | None]:
    child = per_type.child(layer_type)
    data = child.data if child is not None else {}
    return parse_hf_rope(
        FieldReader(source=per_type.source, data={"rope_parameters": data}),
        default_theta=default_theta,
        max_position_embeddings=config.max_position_embeddings,
    )
