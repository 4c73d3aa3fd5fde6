"""Images -> :class:`ImageInputs`, as transformers' Gemma 3 image processor makes them.

Flatten any transparency onto white, resize with Pillow to the processor's size, rescale and
normalize (the shared pixel steps of :mod:`~metrale_model_arch.families.vision.pixels`, whose
``decode_image`` reads an image's bytes).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from metrale_model_arch.families.gemma3.vision.image_inputs import ImageInputs
from metrale_model_arch.families.gemma3.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.families.vision.pixels import normalize, to_rgb


def normalized_image(image: Image.Image, config: ImageProcessorConfig) -> np.ndarray:
    """``(3, height, width)`` float32: the resized, normalized RGB image."""
    height, width = config.size
    rgb = to_rgb(image).resize((width, height), resample=Image.Resampling(config.resample))
    return normalize(
        np.asarray(rgb),
        rescale_factor=config.rescale_factor,
        mean=config.image_mean,
        std=config.image_std,
    )


def preprocess_images(images: Sequence[Image.Image], config: ImageProcessorConfig) -> ImageInputs:
    """The tower's inputs for ``images``, in order."""
    if not images:
        raise ValueError("no images to preprocess")
    pixels = np.stack([normalized_image(image, config) for image in images])
    return ImageInputs(pixel_values=torch.from_numpy(pixels))
