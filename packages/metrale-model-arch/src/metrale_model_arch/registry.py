"""Which family class runs which ``model_type``."""

from __future__ import annotations

from metrale_config import ModelConfig
from metrale_model_arch.families import CausalLM, LlamaForCausalLM

FAMILIES: dict[str, type[CausalLM]] = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": LlamaForCausalLM,
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(FAMILIES))


class UnsupportedModelError(ValueError):
    """A config this build parses but has no torch family to run."""


def family_for(config: ModelConfig) -> type[CausalLM]:
    """The family class for ``config.model_type``, or :class:`UnsupportedModelError`."""
    family = FAMILIES.get(config.model_type)
    if family is None:
        raise UnsupportedModelError(
            f"model_type {config.model_type!r} ({config.source}) has no runnable model family; "
            f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return family
