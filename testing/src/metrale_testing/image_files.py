"""Test images: random RGB pictures, and encoded files of odd sizes and formats (PNG with alpha,
a palette with a transparent colour, JPEG, grayscale with and without alpha, an EXIF-turned
JPEG) for the preprocessing tests. Not imported by the plugin (numpy and PIL at the top)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

EXIF_ORIENTATION = 0x0112


def random_image(height: int, width: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


def encode(image: Image.Image, fmt: str, **params: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def noise(height: int, width: int, channels: int, seed: int) -> np.ndarray:
    shape = (height, width, channels) if channels > 1 else (height, width)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def palette_with_transparency() -> bytes:
    image = Image.fromarray(noise(33, 47, 1, 3) // 16, "L").convert("P")
    return encode(image, "PNG", transparency=5)


def odd_format_images() -> dict[str, bytes]:
    """Five files every image family's preprocessing is checked on, by name; a family adds
    the sizes its own bounds make interesting."""
    return {
        "png-rgba-37x53": encode(Image.fromarray(noise(37, 53, 4, 0), "RGBA"), "PNG"),
        "png-palette-transparent": palette_with_transparency(),
        "jpeg-301x157": encode(Image.fromarray(noise(301, 157, 3, 1), "RGB"), "JPEG", quality=90),
        "png-gray-64x900": encode(Image.fromarray(noise(64, 900, 1, 2), "L"), "PNG"),
        "png-gray-alpha-71x29": encode(Image.fromarray(noise(71, 29, 2, 4), "LA"), "PNG"),
    }


def tiny_png() -> bytes:
    """5x7 pixels: below every family's minimum size."""
    return encode(Image.fromarray(noise(5, 7, 3, 5), "RGB"), "PNG")


def rotated_jpeg() -> bytes:
    """81 wide and 45 tall as stored, turned upright by its EXIF orientation (6)."""
    image = Image.fromarray(noise(45, 81, 3, 7), "RGB")
    exif = image.getexif()
    exif[EXIF_ORIENTATION] = 6
    return encode(image, "JPEG", exif=exif.tobytes())
