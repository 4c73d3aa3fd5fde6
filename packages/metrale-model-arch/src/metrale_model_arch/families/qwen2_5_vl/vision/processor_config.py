"""``Qwen2VLImageProcessorConfig``: how Qwen2.5-VL's images are sized and normalized, from the
checkpoint's ``preprocessor_config.json`` (transformers' ``Qwen2VLImageProcessor`` fields)."""

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


@attrs.frozen(kw_only=True)
class Qwen2VLImageProcessorConfig:
    """An image is resized to a multiple of ``factor`` on each side, holding between
    ``min_pixels`` and ``max_pixels`` pixels (:mod:`.smart_resize`)."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    resample: int = PIL_BICUBIC
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def max_tokens_per_image(self) -> int:
        """Image tokens (merged patches) of the largest image ``max_pixels`` lets through."""
        return self.max_pixels // self.factor**2

    @classmethod
    def from_json(
        cls, data: Mapping[str, object], vision: VisionConfig
    ) -> Qwen2VLImageProcessorConfig:
        """``data`` (a ``preprocessor_config.json``) over the tower's patch geometry; top-level
        ``min_pixels`` / ``max_pixels`` win over ``size``'s ``shortest_edge`` / ``longest_edge``
        (as transformers reads them). Raises ``ValueError`` for fields the tower cannot take or
        steps turned off."""
        check_steps(data)
        defaults = cls()
        size = data.get("size")
        bounds = {**(size if isinstance(size, Mapping) else {})}
        for name, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            if data.get(name) is not None:
                bounds[edge] = data[name]
        config = cls(
            patch_size=integer_field(data, "patch_size", vision.patch_size),
            temporal_patch_size=integer_field(
                data, "temporal_patch_size", vision.temporal_patch_size
            ),
            merge_size=integer_field(data, "merge_size", vision.spatial_merge_size),
            min_pixels=integer_field(bounds, "shortest_edge", defaults.min_pixels),
            max_pixels=integer_field(bounds, "longest_edge", defaults.max_pixels),
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
        if config.max_pixels < config.factor**2:
            raise ValueError(
                f"{PREPROCESSOR_CONFIG}: max_pixels {config.max_pixels} is below one merged "
                f"patch ({config.factor**2} pixels)"
            )
        return config

    @classmethod
    def from_directory(
        cls, directory: Path | None, vision: VisionConfig
    ) -> Qwen2VLImageProcessorConfig:
        """From ``directory/preprocessor_config.json``, or the defaults when there is none
        (or no directory: a GGUF)."""
        return cls.from_json(read_preprocessor_config(directory), vision)
