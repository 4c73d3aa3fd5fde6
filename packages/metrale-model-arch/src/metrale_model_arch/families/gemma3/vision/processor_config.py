"""``ImageProcessorConfig``: how Gemma 3's images are sized and normalized, from the checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from metrale_config import SiglipVisionConfig
from metrale_model_arch.families.vision.processor_fields import (
    PREPROCESSOR_CONFIG,
    integer_field,
    numbers_field,
    read_preprocessor_config,
)

PIL_BILINEAR = 2
# transformers' IMAGENET_STANDARD_MEAN / _STD, this processor's defaults.
STANDARD_MEAN = (0.5, 0.5, 0.5)
STANDARD_STD = (0.5, 0.5, 0.5)


@attrs.frozen(kw_only=True)
class ImageProcessorConfig:
    """transformers' ``Gemma3ImageProcessor`` fields: each image resized to ``size`` (height,
    width; the tower's ``image_size`` square) with Pillow's ``resample``, rescaled and
    normalized. Pan-and-scan (extra crops of a wide image) is not supported."""

    size: tuple[int, int]
    resample: int = PIL_BILINEAR
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, ...] = STANDARD_MEAN
    image_std: tuple[float, ...] = STANDARD_STD

    @classmethod
    def from_json(
        cls, data: Mapping[str, object], vision: SiglipVisionConfig
    ) -> ImageProcessorConfig:
        """``data`` (a ``preprocessor_config.json``) for ``vision``'s tower; raises
        ``ValueError`` naming a field the tower cannot take or a step it turns off."""
        # null is the processor's default (true), as published checkpoints write it.
        for step in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
            if data.get(step) is False:
                raise ValueError(f"{PREPROCESSOR_CONFIG}: {step} false is not supported")
        if data.get("do_pan_and_scan"):
            raise ValueError(f"{PREPROCESSOR_CONFIG}: do_pan_and_scan true is not supported")
        tower = (vision.image_size, vision.image_size)
        size = _size(data.get("size"), tower)
        if size != tower:
            raise ValueError(
                f"{PREPROCESSOR_CONFIG}: size {size[0]}x{size[1]} differs from the vision "
                f"tower's image_size {vision.image_size}"
            )
        return cls(
            size=size,
            resample=integer_field(data, "resample", PIL_BILINEAR, minimum=0),
            rescale_factor=numbers_field(data, "rescale_factor", (1 / 255,))[0],
            image_mean=numbers_field(data, "image_mean", STANDARD_MEAN),
            image_std=numbers_field(data, "image_std", STANDARD_STD),
        )

    @classmethod
    def from_directory(
        cls, directory: Path | None, vision: SiglipVisionConfig
    ) -> ImageProcessorConfig:
        """From ``directory/preprocessor_config.json``, or the defaults when there is none
        (or no directory: a GGUF)."""
        return cls.from_json(read_preprocessor_config(directory), vision)


def _size(value: object, default: tuple[int, int]) -> tuple[int, int]:
    if value is None:
        return default
    if isinstance(value, Mapping) and set(value) == {"height", "width"}:
        height, width = value["height"], value["width"]
        if isinstance(height, int) and isinstance(width, int):
            return height, width
    raise ValueError(f"{PREPROCESSOR_CONFIG}: size must be {{height, width}}, got {value!r}")
