"""``config.json`` → ``ModelConfig`` for gpt-oss (``gpt_oss``), as transformers'
``GptOssConfig`` reads it: YaRN RoPE unless the file says otherwise, sliding-window layers at
even indices unless ``layer_types`` is given, q/k/v/o biases with ``attention_bias``, every
layer's MLP the routed experts (``num_local_experts``, ``intermediate_size`` wide), their
clamped SwiGLU's ``swiglu_alpha`` and ``swiglu_limit``."""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.hf.common import map_layer_type
from metrale_config.hf.llama_like import parse_common
from metrale_config.layer_types import LayerType
from metrale_config.model_config import ModelConfig, MoeConfig

FULL = LayerType.FULL_ATTENTION
SLIDING = LayerType.SLIDING_ATTENTION
_LAYER_TYPE_NAMES = {FULL.value: FULL, SLIDING.value: SLIDING}
# transformers' default when neither ``rope_parameters`` nor ``rope_scaling`` is set.
DEFAULT_ROPE_PARAMETERS = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


def parse_gpt_oss(reader: FieldReader, model_type: str) -> ModelConfig:
    if not any(reader.data.get(name) for name in ("rope_parameters", "rope_scaling")):
        reader = attrs.evolve(
            reader, data={**reader.data, "rope_parameters": DEFAULT_ROPE_PARAMETERS}
        )
    config = parse_common(reader, model_type)
    num_layers = config.num_hidden_layers
    window = reader.optional_integer("sliding_window", 128)
    declared = reader.optional_string_list("layer_types")
    if declared is None:
        layer_types = tuple(SLIDING if i % 2 == 0 else FULL for i in range(num_layers))
    else:
        layer_types = tuple(
            map_layer_type(reader, "layer_types", kind, _LAYER_TYPE_NAMES) for kind in declared
        )
    if window is None:
        layer_types = (FULL,) * len(layer_types)
    name = "num_local_experts" if reader.has("num_local_experts") else "num_experts"
    moe = MoeConfig(
        num_experts=reader.positive_integer(name, 128),
        num_experts_per_tok=reader.positive_integer("num_experts_per_tok", 4),
        moe_intermediate_size=config.intermediate_size,
        # A softmax over the top-k logits: the top-k probabilities, renormalized.
        norm_topk_prob=True,
        mlp_layer_types=("sparse",) * num_layers,
    )
    attention_bias = reader.boolean("attention_bias", True)
    return attrs.evolve(
        config,
        sliding_window=window,
        layer_types=layer_types,
        qkv_bias=attention_bias,
        o_proj_bias=attention_bias,
        moe=moe,
        swiglu_alpha=reader.number("swiglu_alpha", 1.702),
        swiglu_limit=reader.number("swiglu_limit", 7.0),
    )
