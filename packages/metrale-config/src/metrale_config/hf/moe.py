"""``config.json`` → ``ModelConfig`` for the llama-like MoE families: qwen3_moe, mixtral and
glm4_moe (GLM-4.5 / 4.6)."""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.hf.common import parse_mtp
from metrale_config.hf.llama_like import parse_common, parse_llama_like
from metrale_config.model_config import ModelConfig, MoeConfig


def parse_qwen3_moe(reader: FieldReader, model_type: str) -> ModelConfig:
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
    config = parse_llama_like(reader, model_type)
    moe = MoeConfig(
        num_experts=num_experts,
        num_experts_per_tok=reader.integer("num_experts_per_tok", 8),
        moe_intermediate_size=moe_intermediate_size,
        norm_topk_prob=reader.boolean("norm_topk_prob", False),
        mlp_layer_types=mlp_layer_types,
    )
    return attrs.evolve(config, moe=moe)


def parse_mixtral(reader: FieldReader, model_type: str) -> ModelConfig:
    config = parse_llama_like(reader, model_type)
    name = "num_local_experts" if reader.has("num_local_experts") else "num_experts"
    moe = MoeConfig(
        num_experts=reader.integer(name, 8),
        num_experts_per_tok=reader.integer("num_experts_per_tok", 2),
        moe_intermediate_size=config.intermediate_size,
        norm_topk_prob=True,
        mlp_layer_types=("sparse",) * config.num_hidden_layers,
    )
    return attrs.evolve(config, moe=moe)


def parse_glm4_moe(reader: FieldReader, model_type: str) -> ModelConfig:
    """transformers' ``Glm4MoeConfig``: the first ``first_k_dense_replace`` layers dense, the
    rest (and each MTP layer, at index ``num_hidden_layers + k``) sparse; partial rotary from
    ``rope_parameters``, else the top-level field, else 0.5; q/k/v biases with
    ``attention_bias`` (o_proj has none); q/k norms with ``use_qk_norm``."""
    if not reader.has("intermediate_size"):
        reader = attrs.evolve(reader, data={**reader.data, "intermediate_size": 10944})
    config = parse_common(reader, model_type)
    num_layers = config.num_hidden_layers
    first_dense = reader.integer("first_k_dense_replace", 1)
    if first_dense < 0:
        raise reader.error("first_k_dense_replace", f"must not be negative, got {first_dense}")
    partial = reader.number("partial_rotary_factor", 0.5)
    params = reader.child("rope_parameters")
    if params is not None:
        partial = params.number("partial_rotary_factor", partial)
    if not 0.0 < partial <= 1.0:
        raise reader.error("partial_rotary_factor", f"must be in (0, 1], got {partial}")
    num_experts = reader.positive_integer("n_routed_experts", 128)
    num_shared = reader.integer("n_shared_experts", 1)
    if num_shared < 0:
        raise reader.error("n_shared_experts", f"must not be negative, got {num_shared}")
    moe_intermediate_size = reader.positive_integer("moe_intermediate_size", 1408)

    def mlp_kind(layer_index: int) -> str:
        return "sparse" if layer_index >= first_dense else "dense"

    moe = MoeConfig(
        num_experts=num_experts,
        num_experts_per_tok=reader.positive_integer("num_experts_per_tok", 8),
        moe_intermediate_size=moe_intermediate_size,
        num_shared_experts=num_shared,
        shared_expert_intermediate_size=moe_intermediate_size * num_shared or None,
        norm_topk_prob=reader.boolean("norm_topk_prob", True),
        routed_scaling_factor=reader.number("routed_scaling_factor", 1.0),
        n_group=reader.positive_integer("n_group", 1),
        topk_group=reader.positive_integer("topk_group", 1),
        mlp_layer_types=tuple(mlp_kind(i) for i in range(num_layers)),
    )
    if not reader.is_set("num_nextn_predict_layers") and not reader.is_set("num_mtp_layers"):
        # transformers' default: one MTP layer.
        reader = attrs.evolve(reader, data={**reader.data, "num_nextn_predict_layers": 1})
    mtp = parse_mtp(reader)
    if mtp is not None:
        kinds = tuple(mlp_kind(num_layers + k) for k in range(mtp.num_layers))
        mtp = attrs.evolve(mtp, mlp_layer_types=kinds)
    attention_bias = reader.boolean("attention_bias", False)
    return attrs.evolve(
        config,
        qkv_bias=attention_bias,
        qk_norm=reader.boolean("use_qk_norm", False),
        partial_rotary_factor=partial,
        moe=moe,
        mtp=mtp,
    )
