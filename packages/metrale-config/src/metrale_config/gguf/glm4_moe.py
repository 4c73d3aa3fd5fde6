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
from metrale_config.gguf.shared_expert_moe import read_shared_expert_moe
from metrale_config.model_config import ModelConfig, MtpConfig

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
    moe = read_shared_expert_moe(reader, arch, num_blocks)
    kinds = moe.mlp_layer_types
    mtp = None
    if num_mtp:
        mtp = MtpConfig(num_layers=num_mtp, mlp_layer_types=kinds[num_layers:])
    rotary_dims = reader.integer(f"{arch}.rope.dimension_count", config.head_dim)
    return attrs.evolve(
        config,
        num_hidden_layers=num_layers,
        layer_types=config.layer_types[:num_layers],
        partial_rotary_factor=rotary_dims / config.head_dim,
        moe=attrs.evolve(moe, mlp_layer_types=kinds[:num_layers]),
        mtp=mtp,
    )
