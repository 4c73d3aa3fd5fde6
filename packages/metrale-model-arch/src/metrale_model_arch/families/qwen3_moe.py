"""Qwen3-MoE (``qwen3_moe``): Qwen3 attention (q/k RMSNorm, neox rotary) with routed experts.

Layers listed in ``mlp_only_layers``, or off the ``decoder_sparse_step`` stride, keep a dense
MLP of ``intermediate_size`` (``config.moe.mlp_layer_types``). The router's top-k weights are
renormalized only with ``norm_topk_prob``. Checkpoints name each expert
``model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight``; llama.cpp's ``qwen3moe`` stores
them stacked (``blk.L.ffn_{gate,up,down}_exps``) with Q/K rows unpermuted.
"""

from __future__ import annotations

from metrale_config import ModelConfig
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping
from metrale_model_arch.families.moe import MoeForCausalLM, moe_checkpoint_mapping


class Qwen3MoeForCausalLM(MoeForCausalLM):
    """Model type ``qwen3_moe`` (see :class:`MoeForCausalLM`)."""


def qwen3_moe_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    return moe_checkpoint_mapping(config)
