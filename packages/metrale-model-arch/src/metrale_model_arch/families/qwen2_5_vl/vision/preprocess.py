"""Images -> :class:`~metrale_model_arch.families.vision.image_inputs.ImageInputs`, as
transformers' Qwen2-VL image processor (its PIL backend) makes them.

The pixel steps are the shared ones (:mod:`metrale_model_arch.families.vision.pixels`); in
between, the RGB image is resized with Pillow (bicubic by default) to :func:`.smart_resize`'s
size.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from metrale_model_arch.families.qwen2_5_vl.vision.processor_config import (
    Qwen2VLImageProcessorConfig,
)
from metrale_model_arch.families.qwen2_5_vl.vision.smart_resize import smart_resize
from metrale_model_arch.families.vision.image_inputs import ImageInputs
from metrale_model_arch.families.vision.pixels import normalize, patchify, to_rgb


def resized_pixels(image: Image.Image, config: Qwen2VLImageProcessorConfig) -> np.ndarray:
    """``(3, height, width)`` float32: the resized, normalized RGB image."""
    rgb = to_rgb(image)
    height, width = smart_resize(
        rgb.height,
        rgb.width,
        factor=config.factor,
        min_pixels=config.min_pixels,
        max_pixels=config.max_pixels,
    )
    if (height, width) != (rgb.height, rgb.width):
        rgb = rgb.resize((width, height), resample=Image.Resampling(config.resample))
    return normalize(
        np.asarray(rgb),
        rescale_factor=config.rescale_factor,
        mean=config.image_mean,
        std=config.image_std,
    )


def preprocess_images(
    images: Sequence[Image.Image], config: Qwen2VLImageProcessorConfig
) -> ImageInputs:
    """The tower's inputs for ``images``, in order (one frame group each)."""
    if not images:
        raise ValueError("no images to preprocess")
    patches, grids = [], []
    for image in images:
        rows_of_patches, rows, cols = patchify(
            resized_pixels(image, config),
            patch_size=config.patch_size,
            merge_size=config.merge_size,
            temporal_patch_size=config.temporal_patch_size,
        )
        patches.append(rows_of_patches)
        grids.append((1, rows, cols))
    return ImageInputs(
        pixel_values=torch.from_numpy(np.concatenate(patches)),
        grid_thw=torch.tensor(grids, dtype=torch.int64),
    )
