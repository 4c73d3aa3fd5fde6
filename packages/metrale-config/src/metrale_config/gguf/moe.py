"""GGUF metadata of the routed-expert models: ``qwen3moe``, and Mixtral stored as ``llama``.

llama.cpp writes ``{arch}.expert_count``, ``{arch}.expert_used_count`` and, for qwen3moe,
``{arch}.expert_feed_forward_length`` (Mixtral's experts are ``feed_forward_length`` wide). A
layer is sparse when it has a router tensor ``blk.L.ffn_gate_inp.weight``. llama.cpp always
renormalizes the top-k weights of these architectures unless ``{arch}.expert_weights_norm``
says otherwise.
"""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.gguf.header import GgufHeader
from metrale_config.model_config import ModelConfig, MoeConfig

# GGUF architecture -> model_type, for architectures that are MoE whatever their metadata.
MOE_GGUF_ARCHITECTURES = {"qwen3moe": "qwen3_moe"}
# A dense GGUF architecture that becomes this model_type when it has experts.
MOE_VARIANT_OF = {"llama": "mixtral"}


def model_type_of(reader: FieldReader, arch: str) -> str:
    """The model_type of a GGUF file of architecture ``arch``."""
    if arch in MOE_GGUF_ARCHITECTURES:
        return MOE_GGUF_ARCHITECTURES[arch]
    if arch in MOE_VARIANT_OF and reader.integer(f"{arch}.expert_count", 0) > 0:
        return MOE_VARIANT_OF[arch]
    return arch


def with_moe(
    config: ModelConfig, reader: FieldReader, header: GgufHeader, arch: str
) -> ModelConfig:
    """``config`` with its MoE section when its model_type has experts; else unchanged."""
    if config.model_type not in (*MOE_GGUF_ARCHITECTURES.values(), *MOE_VARIANT_OF.values()):
        return config
    moe_intermediate_size = reader.integer(
        f"{arch}.expert_feed_forward_length", config.intermediate_size
    )
    moe = MoeConfig(
        num_experts=reader.integer(f"{arch}.expert_count"),
        num_experts_per_tok=reader.integer(f"{arch}.expert_used_count"),
        moe_intermediate_size=moe_intermediate_size,
        norm_topk_prob=reader.boolean(f"{arch}.expert_weights_norm", True),
        mlp_layer_types=tuple(
            "sparse" if header.has_tensor(f"blk.{i}.ffn_gate_inp.weight") else "dense"
            for i in range(config.num_hidden_layers)
        ),
    )
    return attrs.evolve(config, moe=moe)
