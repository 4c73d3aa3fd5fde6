"""Checkpoint names of Gemma 3 -> the parameters of :class:`.model.Gemma3ForConditionalGeneration`.

The text stack is ``model.language_model.`` (transformers 5's module names) or
``language_model.model.`` (the published checkpoints', and what transformers 5 saves); both map
to ``model.`` and on through llama's mapping (q/k/v and gate/up fused), and
``language_model.lm_head.`` to ``lm_head.``. The SigLIP tower is ``[model.]vision_tower.``,
with or without ``vision_model.`` (transformers 4's module), and maps to
``model.visual.vision_tower.``; the projector ``[model.]multi_modal_projector.`` to
``model.visual.multi_modal_projector.``. Both are skipped when the config has no tower (a
text-only load), and so is a SigLIP pooling head.
"""

from __future__ import annotations

import re

from metrale_config import ModelConfig
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, Skip, TensorTarget
from metrale_model_arch.families.llama import llama_checkpoint_mapping

_TEXT = re.compile(r"^(?:model\.language_model\.|language_model\.model\.)")
_TOWER = re.compile(r"^(?:model\.)?vision_tower\.(?:vision_model\.)?")
_PROJECTOR = re.compile(r"^(?:model\.)?multi_modal_projector\.")
_HEADS = ("lm_head.weight", "language_model.lm_head.weight")


def gemma3_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    text_target = llama_checkpoint_mapping(config)

    def vision_target(short: str) -> TensorTarget | Skip:
        if config.siglip_vision is None:
            return Skip("the config declares no vision tower")
        return TensorTarget(f"model.visual.{short}")

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        if match := _TEXT.match(name):
            return text_target(f"model.{name[match.end() :]}", shape)
        if name in _HEADS:
            if config.tie_word_embeddings:
                return Skip("tied to the embeddings")
            return TensorTarget("lm_head.weight")
        if match := _TOWER.match(name):
            rest = name[match.end() :]
            if rest.startswith("head."):
                return Skip("SigLIP's pooling head (Gemma 3 reads the last hidden state)")
            return vision_target(f"vision_tower.{rest}")
        if match := _PROJECTOR.match(name):
            return vision_target(f"multi_modal_projector.{name[match.end() :]}")
        return None

    return target
