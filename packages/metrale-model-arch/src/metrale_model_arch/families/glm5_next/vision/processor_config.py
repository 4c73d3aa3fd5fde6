"""``ImageProcessorConfig``: how GLM-5.3's images are sized and normalized, from the checkpoint."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import attrs

from metrale_config import VisionConfig

PREPROCESSOR_CONFIG = "preprocessor_config.json"
# OpenAI CLIP's, transformers' defaults for this processor.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PIL_BICUBIC = 3


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

    @classmethod
    def from_json(cls, data: Mapping[str, object], vision: VisionConfig) -> ImageProcessorConfig:
        """``data`` (a ``preprocessor_config.json``) over the tower's patch geometry; raises
        ``ValueError`` for fields the tower cannot take or steps turned off."""
        for step in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
            if data.get(step, True) is not True:
                raise ValueError(f"{PREPROCESSOR_CONFIG}: {step} false is not supported")
        defaults = cls()
        config = cls(
            patch_size=_integer(data, "patch_size", vision.patch_size),
            temporal_patch_size=_integer(data, "temporal_patch_size", vision.temporal_patch_size),
            merge_size=_integer(data, "merge_size", vision.spatial_merge_size),
            patch_expand_factor=_integer(data, "patch_expand_factor", 1),
            min_image_tokens=_integer(data, "min_image_tokens", defaults.min_image_tokens),
            max_image_tokens=_integer(data, "max_image_tokens", defaults.max_image_tokens),
            resample=_integer(data, "resample", PIL_BICUBIC, minimum=0),
            rescale_factor=_numbers(data, "rescale_factor", (defaults.rescale_factor,))[0],
            image_mean=_numbers(data, "image_mean", CLIP_MEAN),
            image_std=_numbers(data, "image_std", CLIP_STD),
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
    def from_directory(cls, directory: Path, vision: VisionConfig) -> ImageProcessorConfig:
        """From ``directory/preprocessor_config.json``, or the defaults when there is none."""
        path = directory / PREPROCESSOR_CONFIG
        data = json.loads(path.read_text()) if path.is_file() else {}
        return cls.from_json(data, vision)


def _integer(data: Mapping[str, object], name: str, default: int, *, minimum: int = 1) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"{PREPROCESSOR_CONFIG}: {name} must be an integer >= {minimum}, got {value!r}"
        )
    return value


def _numbers(
    data: Mapping[str, object], name: str, default: tuple[float, ...]
) -> tuple[float, ...]:
    """A number or a list of numbers, as a tuple."""
    value = data.get(name, default)
    values = list(value) if isinstance(value, list | tuple) else [value]
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if not values or len(numbers) != len(values):
        raise ValueError(f"{PREPROCESSOR_CONFIG}: {name} must be numbers, got {value!r}")
    return tuple(float(v) for v in numbers)
