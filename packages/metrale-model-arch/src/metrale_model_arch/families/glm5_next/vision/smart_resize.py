"""The canvas an image is resized onto: transformers' ``smart_resize`` for GLM-5.3, exactly."""

from __future__ import annotations

import math

import attrs


@attrs.frozen
class Canvas:
    """The resized image (``content``) sits top-left on a zero-padded ``canvas``; both
    ``(height, width)``, the canvas a multiple of the factor on each side."""

    content: tuple[int, int]
    canvas: tuple[int, int]


def _align(value: int, factor: int) -> int:
    return math.ceil(value / factor) * factor


def canvas_size(
    height: int, width: int, *, factor: int, frames: int, min_tokens: int, max_tokens: int
) -> tuple[int, int]:
    """The aligned canvas of ``frames`` frames holding between ``min_tokens`` and
    ``max_tokens`` tokens of ``frames * factor**2`` pixels each."""
    pixels_per_token = frames * factor**2
    min_pixels, max_pixels = min_tokens * pixels_per_token, max_tokens * pixels_per_token
    canvas_h, canvas_w = _align(height, factor), _align(width, factor)
    if frames * canvas_h * canvas_w < min_pixels:
        scale = math.sqrt(min_pixels / (frames * height * width))
        canvas_h = _align(max(1, math.ceil(height * scale)), factor)
        canvas_w = _align(max(1, math.ceil(width * scale)), factor)
    if frames * canvas_h * canvas_w <= max_pixels:
        return canvas_h, canvas_w
    if max_pixels < frames * factor**2:
        raise ValueError(f"max_image_tokens {max_tokens} is below one aligned patch")
    # The tallest content whose aligned canvas fits the budget (the canvas grows with it).
    best, low, high = (factor, factor), 1, height
    while low <= high:
        content_h = (low + high) // 2
        content_w = max(1, math.floor(width * content_h / height))
        candidate = (_align(content_h, factor), _align(content_w, factor))
        if frames * candidate[0] * candidate[1] <= max_pixels:
            best, low = candidate, content_h + 1
        else:
            high = content_h - 1
    return best


def fit_image(
    height: int, width: int, *, factor: int, frames: int, min_tokens: int, max_tokens: int
) -> Canvas:
    """Where an image of ``height x width`` goes: scaled to fit its canvas, never up unless it
    holds fewer than ``min_tokens`` tokens, aspect ratio kept."""
    canvas = canvas_size(
        height, width, factor=factor, frames=frames, min_tokens=min_tokens, max_tokens=max_tokens
    )
    scale = min(canvas[0] / height, canvas[1] / width)
    if frames * height * width >= frames * factor**2 * min_tokens:
        scale = min(1.0, scale)
    content = (
        max(1, min(canvas[0], math.floor(height * scale))),
        max(1, min(canvas[1], math.floor(width * scale))),
    )
    return Canvas(content=content, canvas=canvas)
