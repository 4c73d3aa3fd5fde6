"""The size an image is resized to: transformers' Qwen2-VL ``smart_resize``, exactly.

Each side is rounded to a multiple of ``factor``; when that holds more than ``max_pixels``
pixels, both sides shrink by the same ratio (rounded down to the factor, one factor at least),
when fewer than ``min_pixels`` they grow (rounded up). The image is resized to that size, no
padding.
"""

from __future__ import annotations

import math

MAX_ASPECT_RATIO = 200


def smart_resize(
    height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """``(height, width)`` to resize to; raises ``ValueError`` beyond a 200:1 aspect ratio."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"an image of {height}x{width} pixels is beyond the {MAX_ASPECT_RATIO}:1 aspect "
            "ratio Qwen2-VL's preprocessing takes"
        )
    resized_h = round(height / factor) * factor
    resized_w = round(width / factor) * factor
    if resized_h * resized_w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        resized_h = max(factor, math.floor(height / beta / factor) * factor)
        resized_w = max(factor, math.floor(width / beta / factor) * factor)
    elif resized_h * resized_w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        resized_h = math.ceil(height * beta / factor) * factor
        resized_w = math.ceil(width * beta / factor) * factor
    return resized_h, resized_w
