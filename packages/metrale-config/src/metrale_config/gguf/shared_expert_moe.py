"""The MoE keys llama.cpp's converter writes for DeepSeek-style experts (``deepseek2``,
``glm4moe``): routed and shared experts, ``leading_dense_block_count`` dense layers first,
group-limited routing, and llama.cpp's defaults where a key is absent (no renormalization, no
scaling, one group, no dense layer, no shared expert)."""

from __future__ import annotations

from metrale_config.fields import FieldReader
from metrale_config.model_config import MoeConfig


def read_shared_expert_moe(reader: FieldReader, arch: str, num_blocks: int) -> MoeConfig:
    """The MoE section of ``arch``'s ``num_blocks`` blocks, one ``mlp_layer_types`` entry each."""
    num_dense = reader.integer(f"{arch}.leading_dense_block_count", 0)
    if num_dense < 0:
        raise reader.error(f"{arch}.leading_dense_block_count", "must not be negative")
    moe_intermediate_size = reader.positive_integer(f"{arch}.expert_feed_forward_length")
    num_shared = reader.integer(f"{arch}.expert_shared_count", 0)
    if num_shared < 0:
        raise reader.error(f"{arch}.expert_shared_count", "must not be negative")
    return MoeConfig(
        num_experts=reader.positive_integer(f"{arch}.expert_count"),
        num_experts_per_tok=reader.positive_integer(f"{arch}.expert_used_count"),
        moe_intermediate_size=moe_intermediate_size,
        num_shared_experts=num_shared,
        shared_expert_intermediate_size=moe_intermediate_size * num_shared or None,
        norm_topk_prob=reader.boolean(f"{arch}.expert_weights_norm", False),
        routed_scaling_factor=reader.number(f"{arch}.expert_weights_scale", 1.0),
        n_group=reader.positive_integer(f"{arch}.expert_group_count", 1),
        topk_group=reader.positive_integer(f"{arch}.expert_group_used_count", 1),
        mlp_layer_types=tuple("sparse" if i >= num_dense else "dense" for i in range(num_blocks)),
    )
