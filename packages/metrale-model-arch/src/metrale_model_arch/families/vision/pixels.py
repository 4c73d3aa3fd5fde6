"""The pixel steps every image processor here takes, as transformers' PIL backend takes them.

Decode (EXIF orientation applied), flatten any transparency onto white, rescale and normalize in
float32, and cut into patches merge block by merge block, each patch repeated over
``temporal_patch_size`` frames. How an image is sized in between is the family's.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageOps


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


def normalize(
    pixels: np.ndarray,
    *,
    rescale_factor: float,
    mean: Sequence[float],
    std: Sequence[float],
) -> np.ndarray:
    """``(height, width, 3)`` uint8 -> ``(3, height, width)`` float32."""
    # Rescaled in float64, then float32 throughout (as transformers does).
    scaled = (pixels.astype(np.float64) * rescale_factor).astype(np.float32)
    mean32 = np.asarray(mean, dtype=np.float32)
    std32 = np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(((scaled - mean32) / std32).transpose(2, 0, 1))


def patchify(
    canvas: np.ndarray, *, patch_size: int, merge_size: int, temporal_patch_size: int
) -> tuple[np.ndarray, int, int]:
    """``(3, height, width)`` -> ``(rows * cols, 3 * frames * patch**2)`` patches, rows, cols."""
    channels, height, width = canvas.shape
    patch, merge, frames = patch_size, merge_size, temporal_patch_size
    rows, cols = height // patch, width // patch
    blocks = canvas.reshape(channels, rows // merge, merge, patch, cols // merge, merge, patch)
    # (block row, block col, row in block, col in block, channel, pixel row, pixel col)
    blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)[:, :, :, :, :, None]
    repeated = np.broadcast_to(blocks, (*blocks.shape[:5], frames, patch, patch))
    return repeated.reshape(rows * cols, channels * frames * patch * patch), rows, cols
