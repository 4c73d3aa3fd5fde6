"""Checkpoint names of DeepSeek-V2 / V3 -> the parameters of :class:`.model.DeepseekForCausalLM`.

The MoE families' names (per-expert or stacked experts, ``gate/up_proj`` fused, see
:func:`~metrale_model_arch.families.moe.moe_checkpoint_mapping`) with ``q_proj`` kept whole;
the router and V3's score-correction bias stay float32. V3's MTP layer ``num_hidden_layers + k``
moves to ``model.mtp_layers.k`` (its copies of the embedding and LM head skipped); MTP layers
past ``num_nextn_predict_layers`` (0 serves without them) are skipped.
"""

from __future__ import annotations

import re

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, Skip, TensorTarget
from metrale_model_arch.families.moe import moe_checkpoint_mapping
from metrale_model_arch.owners import MTP_PARAM_PREFIX

_LAYER = re.compile(r"model\.layers\.(?P<layer>\d+)\.(?P<rest>.+)")
_ROUTER = re.compile(r"mlp\.gate\.(?:weight|e_score_correction_bias)")
_Q_PROJ = "self_attn.q_proj.weight"
_MTP_COPIES = ("embed_tokens.weight", "shared_head.head.weight")


def deepseek_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    routed = moe_checkpoint_mapping(config)
    num_layers = config.num_hidden_layers
    num_mtp = config.mtp.num_layers if config.mtp is not None else 0

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        layer = _LAYER.fullmatch(name)
        if layer is None:
            return routed(name, shape)
        index, rest = int(layer["layer"]), layer["rest"]
        if index >= num_layers + num_mtp:
            return Skip(f"layer {index}: an MTP layer beyond num_nextn_predict_layers")
        if index >= num_layers and rest in _MTP_COPIES:
            return Skip(f"MTP layer {index}: a copy of the target's embedding or LM head")
        if rest == _Q_PROJ:
            # Not one of llama's fused q/k/v projections.
            mapped: TensorTarget | Skip | None = TensorTarget(name)
        else:
            mapped = routed(name, shape)
        if _ROUTER.fullmatch(rest) and isinstance(mapped, TensorTarget):
            mapped = attrs.evolve(mapped, keep_float32=True)
        if index < num_layers or not isinstance(mapped, TensorTarget):
            return mapped
        old_prefix = f"model.layers.{index}."
        assert mapped.param.startswith(old_prefix)
        moved = f"{MTP_PARAM_PREFIX}{index - num_layers}.{mapped.param[len(old_prefix) :]}"
        return attrs.evolve(mapped, param=moved)

    return target
