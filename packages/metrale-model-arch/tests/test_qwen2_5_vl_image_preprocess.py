"""Qwen2.5-VL's image preprocessing against transformers' Qwen2-VL processor, bit for bit.

The reference is ``Qwen2VLImageProcessorPil`` (transformers 5's PIL backend; its default
``Qwen2VLImageProcessor`` needs torchvision). Images of odd sizes and formats are generated here
(PNG with alpha, a palette with a transparent colour, JPEG, grayscale with and without alpha,
one turned by its EXIF orientation, ones below the pixel minimum and above the maximum),
encoded, decoded by us and by transformers, and preprocessed by both: ``pixel_values`` and
``image_grid_thw`` must be equal (max abs diff 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from metrale_testing.image_files import encode, noise, odd_format_images, tiny_png
from metrale_testing.preprocess_parity import GridPreprocessing, GridPreprocessingChecks
from PIL import Image

from metrale_config import VisionConfig
from metrale_model_arch.families.qwen2_5_vl.vision.preprocess import preprocess_images
from metrale_model_arch.families.qwen2_5_vl.vision.processor_config import (
    Qwen2VLImageProcessorConfig,
)
from metrale_model_arch.families.qwen2_5_vl.vision.smart_resize import smart_resize

reference = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")

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
IMAGES: dict[str, bytes] = {
    **odd_format_images(),
    "png-5x7-below-minimum": tiny_png(),
    "jpeg-613x497": encode(Image.fromarray(noise(613, 497, 3, 6), "RGB"), "JPEG"),
}
# Small budgets so that the large images are cut down (and the small ones grown) in both.
PROCESSORS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "small-budget": {"min_pixels": 40 * 28 * 28, "max_pixels": 300 * 28 * 28},
}


class TestAgainstTransformers(GridPreprocessingChecks):
    preprocessing = GridPreprocessing(
        Qwen2VLImageProcessorConfig, TOWER, preprocess_images, reference.Qwen2VLImageProcessorPil
    )
    images, processors = IMAGES, PROCESSORS


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
