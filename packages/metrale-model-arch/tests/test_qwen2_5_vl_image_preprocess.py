"""Qwen2.5-VL's image preprocessing against transformers' Qwen2-VL processor, bit for bit.

The reference is ``Qwen2VLImageProcessorPil`` (transformers 5's PIL backend; its default
``Qwen2VLImageProcessor`` needs torchvision). Images of odd sizes and formats are generated here
(PNG with alpha, a palette with a transparent colour, JPEG, grayscale with and without alpha,
one turned by its EXIF orientation, ones below the pixel minimum and above the maximum),
encoded, decoded by us and by transformers, and preprocessed by both: ``pixel_values`` and
``image_grid_thw`` must be equal (max abs diff 0).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from metrale_config import VisionConfig
from metrale_model_arch.families.qwen2_5_vl.vision.preprocess import preprocess_images
from metrale_model_arch.families.qwen2_5_vl.vision.processor_config import (
    Qwen2VLImageProcessorConfig,
)
from metrale_model_arch.families.qwen2_5_vl.vision.smart_resize import smart_resize
from metrale_model_arch.families.vision.pixels import decode_image

reference = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
image_utils = pytest.importorskip("transformers.image_utils")

TOWER = VisionConfig(
    depth=1,
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    out_hidden_size=64,
    projection_intermediate_size=128,
    image_token_id=1,
    window_size=112,
)
EXIF_ORIENTATION = 0x0112


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


IMAGES: dict[str, bytes] = {
    "png-rgba-37x53": encode(Image.fromarray(noise(37, 53, 4, 0), "RGBA"), "PNG"),
    "png-palette-transparent": palette_with_transparency(),
    "jpeg-301x157": encode(Image.fromarray(noise(301, 157, 3, 1), "RGB"), "JPEG", quality=90),
    "png-gray-64x900": encode(Image.fromarray(noise(64, 900, 1, 2), "L"), "PNG"),
    "png-gray-alpha-71x29": encode(Image.fromarray(noise(71, 29, 2, 4), "LA"), "PNG"),
    "png-5x7-below-minimum": encode(Image.fromarray(noise(5, 7, 3, 5), "RGB"), "PNG"),
    "jpeg-613x497": encode(Image.fromarray(noise(613, 497, 3, 6), "RGB"), "JPEG"),
}
# Small budgets so that the large images are cut down (and the small ones grown) in both.
PROCESSORS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "small-budget": {"min_pixels": 40 * 28 * 28, "max_pixels": 300 * 28 * 28},
}


def rotated_jpeg() -> bytes:
    image = Image.fromarray(noise(45, 81, 3, 7), "RGB")
    exif = image.getexif()
    exif[EXIF_ORIENTATION] = 6
    return encode(image, "JPEG", exif=exif.tobytes())


def ours(data: bytes, options: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    config = Qwen2VLImageProcessorConfig.from_json(options, TOWER)
    inputs = preprocess_images([decode_image(data)], config)
    return inputs.pixel_values, inputs.grid_thw


def theirs(
    image: Image.Image | list[Image.Image], options: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    out = reference.Qwen2VLImageProcessorPil(**options)(image, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


@pytest.mark.parametrize("options", PROCESSORS.values(), ids=PROCESSORS.keys())
@pytest.mark.parametrize("name", IMAGES)
def test_pixel_values_equal_transformers(name: str, options: dict[str, Any]) -> None:
    data = IMAGES[name]
    pixel_values, grid = ours(data, options)
    expected_values, expected_grid = theirs(Image.open(io.BytesIO(data)), options)
    assert grid.tolist() == expected_grid.tolist()
    assert float((pixel_values - expected_values).abs().max()) == 0.0


def test_exif_orientation_is_applied_as_transformers_load_image(tmp_path: Path) -> None:
    path = tmp_path / "rotated.jpeg"
    path.write_bytes(rotated_jpeg())
    pixel_values, grid = ours(path.read_bytes(), {})
    expected_values, expected_grid = theirs(image_utils.load_image(str(path)), {})
    assert grid.tolist() == expected_grid.tolist()
    ((_, rows, cols),) = grid.tolist()
    assert rows > cols  # 81 wide and 45 tall, turned upright
    torch.testing.assert_close(pixel_values, expected_values, rtol=0, atol=0)


def test_several_images_concatenate_in_order() -> None:
    names = ["png-rgba-37x53", "jpeg-301x157", "png-gray-64x900"]
    config = Qwen2VLImageProcessorConfig.from_json({}, TOWER)
    inputs = preprocess_images([decode_image(IMAGES[name]) for name in names], config)
    expected_values, expected_grid = theirs(
        [Image.open(io.BytesIO(IMAGES[name])) for name in names], {}
    )
    assert inputs.grid_thw.tolist() == expected_grid.tolist()
    torch.testing.assert_close(inputs.pixel_values, expected_values, rtol=0, atol=0)
    assert inputs.num_tokens(2) == [int(t * h * w) // 4 for t, h, w in expected_grid.tolist()]


@pytest.mark.parametrize("budget", [(56 * 56, 28 * 28 * 1280), (4 * 784, 24 * 784)], ids=str)
def test_the_size_is_transformers_smart_resize(budget: tuple[int, int]) -> None:
    min_pixels, max_pixels = budget
    sizes = [(h, w) for h in (3, 13, 28, 29, 100, 517, 3001) for w in (3, 28, 57, 640, 4000)]
    for height, width in sizes:
        if max(height, width) / min(height, width) > 200:
            continue
        expected = reference.smart_resize(
            height, width, factor=28, min_pixels=min_pixels, max_pixels=max_pixels
        )
        got = smart_resize(height, width, factor=28, min_pixels=min_pixels, max_pixels=max_pixels)
        assert got == expected, (height, width)
    with pytest.raises(ValueError, match="200:1 aspect ratio"):
        smart_resize(3, 4000, factor=28, min_pixels=min_pixels, max_pixels=max_pixels)


def test_the_processor_config_is_read_from_the_checkpoint(tmp_path: Path) -> None:
    saved = {"min_pixels": 7 * 784, "max_pixels": 99 * 784, "image_mean": [0.5, 0.5, 0.5]}
    reference.Qwen2VLImageProcessorPil(**saved).save_pretrained(tmp_path)
    config = Qwen2VLImageProcessorConfig.from_directory(tmp_path, TOWER)
    assert (config.min_pixels, config.max_pixels) == (7 * 784, 99 * 784)
    assert config.image_mean == (0.5, 0.5, 0.5)
    assert config.factor == 28
    # The hub's preprocessor_config.json names the bounds at the top level, beside ``size``.
    hub = {"min_pixels": 3136, "max_pixels": 12845056, "size": {"shortest_edge": 1}}
    assert Qwen2VLImageProcessorConfig.from_json(hub, TOWER).max_pixels == 12845056
    assert Qwen2VLImageProcessorConfig.from_json(hub, TOWER).min_pixels == 3136
    default = Qwen2VLImageProcessorConfig.from_directory(tmp_path / "none", TOWER)
    assert default == Qwen2VLImageProcessorConfig()


def test_a_processor_the_tower_cannot_take_is_refused() -> None:
    with pytest.raises(ValueError, match="differ from the vision tower's"):
        Qwen2VLImageProcessorConfig.from_json({"patch_size": 16}, TOWER)
    with pytest.raises(ValueError, match="do_normalize false"):
        Qwen2VLImageProcessorConfig.from_json({"do_normalize": False}, TOWER)
    with pytest.raises(ValueError, match="max_pixels 100 is below one merged patch"):
        Qwen2VLImageProcessorConfig.from_json({"max_pixels": 100}, TOWER)
