"""GLM-5.3's image preprocessing against transformers' processor (its PIL backend), bit for bit.

Images of odd sizes and formats are generated here (PNG with alpha, a palette with a transparent
colour, JPEG, grayscale with and without alpha, one turned by its EXIF orientation, ones below
the token minimum and above the maximum), encoded, decoded by us and by transformers, and
preprocessed by both: ``pixel_values`` and ``image_grid_thw`` must be equal (max abs diff 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from metrale_testing.image_files import encode, noise, odd_format_images, tiny_png
from metrale_testing.preprocess_parity import GridPreprocessing, GridPreprocessingChecks
from PIL import Image

from metrale_config import VisionConfig
from metrale_model_arch.families.glm5_next.vision.preprocess import (
    decode_image,
    preprocess_images,
)
from metrale_model_arch.families.glm5_next.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.families.glm5_next.vision.smart_resize import canvas_size

transformers = pytest.importorskip("transformers")
reference = pytest.importorskip("transformers.models.glm5_next.image_processing_pil_glm5_next")

TOWER = VisionConfig(
    depth=1,
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    out_hidden_size=64,
    projection_intermediate_size=64,
    image_token_id=1,
)
IMAGES: dict[str, bytes] = {
    **odd_format_images(),
    "png-5x7-below-minimum": tiny_png(),
    "jpeg-1203x997": encode(Image.fromarray(noise(1203, 997, 3, 6), "RGB"), "JPEG"),
}
# Small budgets so that the large images are cut down (and the small ones grown) in both.
PROCESSORS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "small-budget": {"min_image_tokens": 40, "max_image_tokens": 300},
}


class TestAgainstTransformers(GridPreprocessingChecks):
    preprocessing = GridPreprocessing(
        ImageProcessorConfig, TOWER, preprocess_images, reference.Glm5NextImageProcessorPil
    )
    images, processors = IMAGES, PROCESSORS


@pytest.mark.parametrize("budget", [(16, 8000), (4, 24), (100, 120)], ids=str)
def test_the_canvas_is_transformers_smart_resize(budget: tuple[int, int]) -> None:
    min_tokens, max_tokens = budget
    sizes = [(h, w) for h in (1, 2, 13, 28, 29, 100, 517, 3001) for w in (1, 3, 28, 57, 640, 4000)]
    for height, width in sizes:
        expected = reference.smart_resize(
            num_frames=2,
            height=height,
            width=width,
            temporal_factor=2,
            factor=28,
            min_pixels=min_tokens,
            max_pixels=max_tokens,
        )
        got = canvas_size(
            height, width, factor=28, frames=2, min_tokens=min_tokens, max_tokens=max_tokens
        )
        assert got == expected, (height, width)


def test_the_processor_config_is_read_from_the_checkpoint(tmp_path: Path) -> None:
    saved = {"patch_size": 14, "min_image_tokens": 7, "image_mean": [0.5, 0.5, 0.5]}
    reference.Glm5NextImageProcessorPil(**saved).save_pretrained(tmp_path)
    config = ImageProcessorConfig.from_directory(tmp_path, TOWER)
    assert config.min_image_tokens == 7
    assert config.image_mean == (0.5, 0.5, 0.5)
    assert config.factor == 28
    assert ImageProcessorConfig.from_directory(tmp_path / "none", TOWER) == ImageProcessorConfig()


def test_a_processor_the_tower_cannot_take_is_refused() -> None:
    with pytest.raises(ValueError, match="differ from the vision tower's"):
        ImageProcessorConfig.from_json({"patch_size": 16}, TOWER)
    with pytest.raises(ValueError, match="do_normalize false"):
        ImageProcessorConfig.from_json({"do_normalize": False}, TOWER)


def test_bytes_that_are_not_an_image_raise_oserror() -> None:
    with pytest.raises(OSError, match="cannot identify image file"):
        decode_image(b"not an image")
