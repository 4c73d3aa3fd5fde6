"""Checkpoint names of DeepSeek-V2 / V3 -> the parameters of :class:`.model.DeepseekForCausalLM`.

The MoE families' names (per-expert or stacked experts, ``gate/up_proj`` fused, see
:func:`~metrale_model_arch.families.moe.moe_checkpoint_mapping`) with ``q_proj`` kept whole;
the router and V3's score-correction bias stay float32. V3's multi-token-prediction layers
(``model.layers.{num_hidden_layers + k}``) are skipped: not loaded here yet.
"""

from __future__ import annotations

import re

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, Skip, TensorTarget
from metrale_model_arch.families.moe import moe_checkpoint_mapping

_LAYER = re.compile(r"model\.layers\.(?P<layer>\d+)\.(?P<rest>.+)")
_ROUTER = re.compile(r"mlp\.gate\.(?:weight|e_score_correction_bias)")
_Q_PROJ = "self_attn.q_proj.weight"


def deepseek_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    routed = moe_checkpoint_mapping(config)
    num_layers = config.num_hidden_layers

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        layer = _LAYER.fullmatch(name)
        if layer is None:
            return routed(name, shape)
        index, rest = int(layer["layer"]), layer["rest"]
        if index >= num_layers:
            return Skip(f"layer {index}: an MTP layer ({config.model_type} does not load them)")
        if rest == _Q_PROJ:
            # Not one of llama's fused q/k/v projections.
            return TensorTarget(name)
        mapped = routed(name, shape)
        if _ROUTER.fullmatch(rest) and isinstance(mapped, TensorTarget):
            return attrs.evolve(mapped, keep_float32=True)
        return mapped

    return target
