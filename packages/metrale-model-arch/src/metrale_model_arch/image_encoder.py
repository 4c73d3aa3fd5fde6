"""Which models the engine serves images for, and their image encoders: one record per model
type. ``image_encoder_for`` gives a loaded model's
:class:`~metrale_model_arch.prepared_image.ImageEncoder`, or ``None`` for a model without a
vision tower the engine serves; ``planned_tokens_per_image`` what the memory plan reserves for
one image, from files alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.families.gemma3.vision.encoder import Gemma3ImageEncoder
from metrale_model_arch.families.glm5_next.vision.encoder import Glm5NextImageEncoder
from metrale_model_arch.families.glm5_next.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.families.qwen2_5_vl.vision.encoder import Qwen2_5_VLImageEncoder
from metrale_model_arch.families.qwen2_5_vl.vision.processor_config import (
    Qwen2VLImageProcessorConfig,
)
from metrale_model_arch.prepared_image import ImageEncoder

if TYPE_CHECKING:
    from metrale_model_arch.load import LoadedModel


@attrs.frozen
class ImageFamily:
    """How a model type's images are encoded, and the most tokens one image takes (from its
    config and checkpoint directory: the preprocessing's bounds)."""

    encoder: Callable[[LoadedModel], ImageEncoder]
    tokens_per_image: Callable[[ModelConfig, Path | None], int]


def _glm5_next_tokens(config: ModelConfig, directory: Path | None) -> int:
    assert config.vision is not None
    return ImageProcessorConfig.from_directory(directory, config.vision).max_tokens_per_image


def _qwen2_5_vl_tokens(config: ModelConfig, directory: Path | None) -> int:
    assert config.vision is not None
    return Qwen2VLImageProcessorConfig.from_directory(directory, config.vision).max_tokens_per_image


def _gemma3_tokens(config: ModelConfig, directory: Path | None) -> int:
    assert config.siglip_vision is not None
    return config.siglip_vision.mm_tokens_per_image


_GLM5_NEXT = ImageFamily(
    encoder=Glm5NextImageEncoder.for_loaded, tokens_per_image=_glm5_next_tokens
)
IMAGE_FAMILIES: dict[str, ImageFamily] = {
    "glm5_next": _GLM5_NEXT,
    "glm5_next_text": _GLM5_NEXT,
    "qwen2_5_vl": ImageFamily(
        encoder=Qwen2_5_VLImageEncoder.for_loaded, tokens_per_image=_qwen2_5_vl_tokens
    ),
    "gemma3": ImageFamily(encoder=Gemma3ImageEncoder.for_loaded, tokens_per_image=_gemma3_tokens),
}


def serves_images(config: ModelConfig) -> bool:
    """Whether the engine can take images for ``config``: a vision tower it can serve."""
    has_tower = config.vision is not None or config.siglip_vision is not None
    return has_tower and config.model_type in IMAGE_FAMILIES


def image_encoder_for(loaded: LoadedModel) -> ImageEncoder | None:
    """The loaded model's image encoder; ``None`` without a vision tower it can serve."""
    if not serves_images(loaded.config):
        return None
    return IMAGE_FAMILIES[loaded.config.model_type].encoder(loaded)


def planned_tokens_per_image(config: ModelConfig, directory: Path | None) -> int:
    """The most image tokens one image takes after the preprocessing of the checkpoint in
    ``directory`` (its ``preprocessor_config.json``; defaults without one). ``config`` must
    have a vision tower the engine serves."""
    if not serves_images(config):
        raise ValueError(f"{config.source}: no vision tower the engine serves")
    return IMAGE_FAMILIES[config.model_type].tokens_per_image(config, directory)
