"""``config.json`` → ``ModelConfig`` for the llama-like MoE families: qwen3_moe and mixtral."""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.hf.llama_like import parse_llama_like
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
