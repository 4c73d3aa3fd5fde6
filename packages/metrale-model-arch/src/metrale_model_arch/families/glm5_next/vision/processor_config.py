"""``ImageProcessorConfig``: how GLM-5.3's images are sized and normalized, from the checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from metrale_config import VisionConfig
from metrale_model_arch.families.vision.processor_fields import (
    CLIP_MEAN,
    CLIP_STD,
    PIL_BICUBIC,
    PREPROCESSOR_CONFIG,
    check_steps,
    integer_field,
    numbers_field,
    read_preprocessor_config,
)

__all__ = ["CLIP_MEAN", "CLIP_STD", "PIL_BICUBIC", "PREPROCESSOR_CONFIG", "ImageProcessorConfig"]


@attrs.frozen(kw_only=True)
class ImageProcessorConfig:
    """transformers' ``Glm5NextImageProcessor`` fields; an image is resized to a multiple of
    ``factor`` on each side, between ``min_image_tokens`` and ``max_image_tokens`` merged
    patches (counted at ``temporal_patch_size`` frames)."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    patch_expand_factor: int = 1
    min_image_tokens: int = 16
    max_image_tokens: int = 8000
    resample: int = PIL_BICUBIC
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size * self.patch_expand_factor

    @property
    def max_tokens_per_image(self) -> int:
        """The most image tokens an image resizes to: ``max_image_tokens`` counts tokens of
        ``factor`` pixels a side, each ``patch_expand_factor**2`` merged patches."""
        return self.max_image_tokens * self.patch_expand_factor**2

    @classmethod
    def from_json(cls, data: Mapping[str, object], vision: VisionConfig) -> ImageProcessorConfig:
        """``data`` (a ``preprocessor_config.json``) over the tower's patch geometry; raises
        ``ValueError`` for fields the tower cannot take or steps turned off."""
        check_steps(data)
        defaults = cls()
        config = cls(
            patch_size=integer_field(data, "patch_size", vision.patch_size),
            temporal_patch_size=integer_field(
                data, "temporal_patch_size", vision.temporal_patch_size
            ),
            merge_size=integer_field(data, "merge_size", vision.spatial_merge_size),
            patch_expand_factor=integer_field(data, "patch_expand_factor", 1),
            min_image_tokens=integer_field(data, "min_image_tokens", defaults.min_image_tokens),
            max_image_tokens=integer_field(data, "max_image_tokens", defaults.max_image_tokens),
            resample=integer_field(data, "resample", PIL_BICUBIC, minimum=0),
            rescale_factor=numbers_field(data, "rescale_factor", (defaults.rescale_factor,))[0],
            image_mean=numbers_field(data, "image_mean", CLIP_MEAN),
            image_std=numbers_field(data, "image_std", CLIP_STD),
        )
        geometry = (config.patch_size, config.temporal_patch_size, config.merge_size)
        tower = (vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size)
        if geometry != tower:
            raise ValueError(
                f"{PREPROCESSOR_CONFIG}: patch, temporal patch and merge sizes {geometry} "
                f"differ from the vision tower's {tower}"
            )
        return config

    @classmethod
    def from_directory(cls, directory: Path | None, vision: VisionConfig) -> ImageProcessorConfig:
        """From ``directory/preprocessor_config.json``, or the defaults when there is none
        (or no directory: a GGUF)."""
        return cls.from_json(read_preprocessor_config(directory), vision)
