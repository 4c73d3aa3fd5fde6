"""GGUF metadata of GLM-4.5 / 4.6 (``glm4moe``, llama.cpp's ``Glm4MoeModel``).

The converter counts the MTP layers in ``block_count`` (they follow the stack as
``blk.{num_hidden_layers + k}``, ``nextn_predict_layers`` of them) and writes the routed expert
count, the shared expert count, ``leading_dense_block_count`` dense layers first, the sigmoid
gating, ``expert_weights_scale`` and ``expert_weights_norm`` (llama.cpp's default when absent:
no renormalization), and ``rope.dimension_count`` for the rotated part of each head.
"""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.gguf.header import GgufHeader
from metrale_config.model_config import ModelConfig, MoeConfig, MtpConfig

GLM4_MOE_ARCHITECTURE = "glm4moe"
SIGMOID_GATING = 2


def with_glm4_moe(config: ModelConfig, reader: FieldReader, header: GgufHeader) -> ModelConfig:
    """``config`` (read with every block as a layer) as GLM-4.5's stack, experts and MTP
    layers."""
    del header
    arch = GLM4_MOE_ARCHITECTURE
    gating_key = f"{arch}.expert_gating_func"
    gating = reader.integer(gating_key, SIGMOID_GATING)
    if gating != SIGMOID_GATING:
        raise reader.error(gating_key, f"must be {SIGMOID_GATING} (sigmoid), got {gating}")
    num_blocks = config.num_hidden_layers
    num_mtp = reader.integer(f"{arch}.nextn_predict_layers", 0)
    if not 0 <= num_mtp < num_blocks:
        raise reader.error(f"{arch}.nextn_predict_layers", f"must be in [0, {num_blocks})")
    num_layers = num_blocks - num_mtp
    num_dense = reader.integer(f"{arch}.leading_dense_block_count", 0)
    moe_intermediate_size = reader.positive_integer(f"{arch}.expert_feed_forward_length")
    num_shared = reader.integer(f"{arch}.expert_shared_count", 0)

    def mlp_kind(layer_index: int) -> str:
        return "sparse" if layer_index >= num_dense else "dense"

    moe = MoeConfig(
        num_experts=reader.positive_integer(f"{arch}.expert_count"),
        num_experts_per_tok=reader.positive_integer(f"{arch}.expert_used_count"),
        moe_intermediate_size=moe_intermediate_size,
        num_shared_experts=num_shared,
        shared_expert_intermediate_size=moe_intermediate_size * num_shared or None,
        norm_topk_prob=reader.boolean(f"{arch}.expert_weights_norm", False),
        routed_scaling_factor=reader.number(f"{arch}.expert_weights_scale", 1.0),
        n_group=reader.positive_integer(f"{arch}.expert_group_count", 1),
        topk_group=reader.positive_integer(f"{arch}.expert_group_used_count", 1),
        mlp_layer_types=tuple(mlp_kind(i) for i in range(num_layers)),
    )
    mtp = None
    if num_mtp:
        kinds = tuple(mlp_kind(num_layers + k) for k in range(num_mtp))
        mtp = MtpConfig(num_layers=num_mtp, mlp_layer_types=kinds)
    rotary_dims = reader.integer(f"{arch}.rope.dimension_count", config.head_dim)
    return attrs.evolve(
        config,
        num_hidden_layers=num_layers,
        layer_types=config.layer_types[:num_layers],
        partial_rotary_factor=rotary_dims / config.head_dim,
        moe=moe,
        mtp=mtp,
    )
