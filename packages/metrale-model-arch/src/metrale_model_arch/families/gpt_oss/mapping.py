"""Checkpoint names of gpt-oss -> the parameters of :class:`.model.GptOssForCausalLM`.

transformers' names: ``q/k/v_proj`` (weights and biases) fused as the llama family fuses them,
the router (``mlp.router.weight`` / ``bias``) kept float32, everything else by its own name
(the stacked experts ``mlp.experts.{gate_up_proj,down_proj}[_bias]``, ``self_attn.sinks``).
"""

from __future__ import annotations

import re

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, Skip, TensorTarget
from metrale_model_arch.families.llama import llama_checkpoint_mapping

_ROUTER = re.compile(r"model\.layers\.\d+\.mlp\.router\.(?:weight|bias)")


def gpt_oss_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    llama = llama_checkpoint_mapping(config)

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        mapped = llama(name, shape)
        if _ROUTER.fullmatch(name) and isinstance(mapped, TensorTarget):
            return attrs.evolve(mapped, keep_float32=True)
        return mapped

    return target
