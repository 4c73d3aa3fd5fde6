"""Mixtral (``mixtral``): Mistral attention with eight routed experts in every layer.

Every layer is sparse and the router's top-k weights are always renormalized. Checkpoints name
the experts ``model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.weight`` (gate, up, down)
and the router ``block_sparse_moe.gate.weight``; transformers 5 holds them as
``mlp.experts.{gate_up_proj,down_proj}`` and ``mlp.gate``. llama.cpp stores Mixtral as
architecture ``llama`` (Q/K rows permuted) with ``llama.expert_count`` and stacked experts.
"""

from __future__ import annotations

from metrale_config import ModelConfig
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping
from metrale_model_arch.families.moe import MoeForCausalLM, moe_checkpoint_mapping


class MixtralForCausalLM(MoeForCausalLM):
    """Model type ``mixtral`` (see :class:`MoeForCausalLM`)."""


def mixtral_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    return moe_checkpoint_mapping(config)
