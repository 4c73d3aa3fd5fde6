"""Images -> :class:`ImageInputs`, as transformers' GLM-5.3 image processor makes them.

Decode (EXIF orientation applied), flatten any transparency onto white, resize with Pillow onto
the top-left of a zero canvas (:mod:`.smart_resize`), rescale and normalize in float32, and cut
into patches merge block by merge block, each patch repeated over ``temporal_patch_size`` frames
(every step but the canvas is shared: :mod:`metrale_model_arch.families.vision.pixels`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from metrale_model_arch.families.glm5_next.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.families.glm5_next.vision.smart_resize import fit_image
from metrale_model_arch.families.vision import pixels
from metrale_model_arch.families.vision.image_inputs import ImageInputs
from metrale_model_arch.families.vision.pixels import decode_image, to_rgb

__all__ = ["decode_image", "normalized_canvas", "patchify", "preprocess_images", "to_rgb"]


def normalized_canvas(image: Image.Image, config: ImageProcessorConfig) -> np.ndarray:
    """``(3, height, width)`` float32: the resized, padded, normalized RGB image."""
    rgb = to_rgb(image)
    fit = fit_image(
        rgb.height,
        rgb.width,
        factor=config.factor,
        frames=config.temporal_patch_size,
        min_tokens=config.min_image_tokens,
        max_tokens=config.max_image_tokens,
    )
    (content_h, content_w), (canvas_h, canvas_w) = fit.content, fit.canvas
    if (content_h, content_w) != (rgb.height, rgb.width):
        rgb = rgb.resize((content_w, content_h), resample=Image.Resampling(config.resample))
    canvas = np.zeros((canvas_h, canvas_w, 3), dtype=np.uint8)
    canvas[:content_h, :content_w] = np.asarray(rgb)
    return pixels.normalize(
        canvas,
        rescale_factor=config.rescale_factor,
        mean=config.image_mean,
        std=config.image_std,
    )


def patchify(canvas: np.ndarray, config: ImageProcessorConfig) -> tuple[np.ndarray, int, int]:
    """``(3, height, width)`` -> ``(rows * cols, 3 * frames * patch**2)`` patches, rows, cols."""
    return pixels.patchify(
        canvas,
        patch_size=config.patch_size,
        merge_size=config.merge_size,
        temporal_patch_size=config.temporal_patch_size,
    )


def preprocess_images(images: Sequence[Image.Image], config: ImageProcessorConfig) -> ImageInputs:
    """The tower's inputs for ``images``, in order (one frame group each)."""
    if not images:
        raise ValueError("no images to preprocess")
    patches, grids = [], []
    for image in images:
        rows_of_patches, rows, cols = patchify(normalized_canvas(image, config), config)
        patches.append(rows_of_patches)
        grids.append((1, rows, cols))
    return ImageInputs(
        pixel_values=torch.from_numpy(np.concatenate(patches)),
        grid_thw=torch.tensor(grids, dtype=torch.int64),
    )
