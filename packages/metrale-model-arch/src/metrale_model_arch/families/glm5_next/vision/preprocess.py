"""Images -> :class:`ImageInputs`, as transformers' GLM-5.3 image processor makes them.

Decode (EXIF orientation applied), flatten any transparency onto white, resize with Pillow onto
the top-left of a zero canvas (:mod:`.smart_resize`), rescale and normalize in float32, and cut
into patches merge block by merge block, each patch repeated over ``temporal_patch_size`` frames.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, ImageOps

from metrale_model_arch.families.glm5_next.vision.image_inputs import ImageInputs
from metrale_model_arch.families.glm5_next.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.families.glm5_next.vision.smart_resize import fit_image


def decode_image(data: bytes) -> Image.Image:
    """Raises ``PIL.UnidentifiedImageError`` (an ``OSError``) for bytes Pillow cannot read."""
    image = Image.open(io.BytesIO(data))
    image.load()
    return ImageOps.exif_transpose(image)


def to_rgb(image: Image.Image) -> Image.Image:
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")


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
    pixels = np.zeros((canvas_h, canvas_w, 3), dtype=np.uint8)
    pixels[:content_h, :content_w] = np.asarray(rgb)
    # Rescaled in float64, then float32 throughout (as transformers does).
    scaled = (pixels.astype(np.float64) * config.rescale_factor).astype(np.float32)
    mean = np.asarray(config.image_mean, dtype=np.float32)
    std = np.asarray(config.image_std, dtype=np.float32)
    return np.ascontiguousarray(((scaled - mean) / std).transpose(2, 0, 1))


def patchify(canvas: np.ndarray, config: ImageProcessorConfig) -> tuple[np.ndarray, int, int]:
    """``(3, height, width)`` -> ``(rows * cols, 3 * frames * patch**2)`` patches, rows, cols."""
    channels, height, width = canvas.shape
    patch, merge, frames = config.patch_size, config.merge_size, config.temporal_patch_size
    rows, cols = height // patch, width // patch
    blocks = canvas.reshape(channels, rows // merge, merge, patch, cols // merge, merge, patch)
    # (block row, block col, row in block, col in block, channel, pixel row, pixel col)
    blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)[:, :, :, :, :, None]
    repeated = np.broadcast_to(blocks, (*blocks.shape[:5], frames, patch, patch))
    return repeated.reshape(rows * cols, channels * frames * patch * patch), rows, cols


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
