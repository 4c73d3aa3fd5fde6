"""Checkpoint names of Qwen2.5-VL -> the parameters of :class:`.model.Qwen2_5_VLForCausalLM`.

A checkpoint names the text stack ``model.`` (the hub's, and transformers 5's saves) or
``model.language_model.`` (transformers 5's module names), the tower ``visual.`` or
``model.visual.``: all are read as llama's names under ``model.`` and ``model.visual.``, so q/k/v
fuse into ``qkv_proj`` and every gate/up pair (the tower's blocks' too) into ``gate_up_proj``.
The tower is skipped when the config declares none (a text-only load).
"""

from __future__ import annotations

import re

from metrale_config import ModelConfig
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, Skip, TensorTarget
from metrale_model_arch.families.llama import llama_checkpoint_mapping

_LANGUAGE_MODEL = "model.language_model."
_VISION = re.compile(r"^(?:model\.)?visual\.")


def qwen2_5_vl_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    as_llama = llama_checkpoint_mapping(config)

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        if vision := _VISION.match(name):
            if config.vision is None:
                return Skip("the config declares no vision tower")
            name = f"model.visual.{name[vision.end() :]}"
        elif name.startswith(_LANGUAGE_MODEL):
            name = f"model.{name[len(_LANGUAGE_MODEL) :]}"
        return as_llama(name, shape)

    return target
