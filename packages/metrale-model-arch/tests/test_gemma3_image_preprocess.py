"""Gemma 3's image preprocessing against transformers' ``Gemma3ImageProcessorPil`` (what
``Gemma3ImageProcessor`` is without torchvision), bit for bit.

Images of odd sizes and formats (PNG with alpha, a palette with a transparent colour, JPEG,
grayscale with and without alpha, tiny and large) are encoded, decoded by the shared
``decode_image`` and preprocessed by us and by transformers: ``pixel_values`` must be equal (max
abs diff 0), with the default bilinear and with bicubic resampling.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from metrale_testing.image_files import encode, noise, odd_format_images, tiny_png
from PIL import Image

from metrale_config import SiglipVisionConfig
from metrale_model_arch.families.gemma3.vision.preprocess import preprocess_images
from metrale_model_arch.families.gemma3.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.families.vision.pixels import decode_image

reference = pytest.importorskip("transformers.models.gemma3.image_processing_pil_gemma3")

SIZE = 28
TOWER = SiglipVisionConfig(
    num_hidden_layers=1,
    hidden_size=8,
    intermediate_size=8,
    num_attention_heads=2,
    image_size=SIZE,
    patch_size=7,
    mm_tokens_per_image=4,
    image_token_id=3,
    boi_token_id=4,
    eoi_token_id=5,
)


IMAGES: dict[str, bytes] = {
    **odd_format_images(),
    "png-5x7-upscaled": tiny_png(),
    "png-28x28-unresized": encode(Image.fromarray(noise(SIZE, SIZE, 3, 6), "RGB"), "PNG"),
}
PROCESSORS: dict[str, dict[str, Any]] = {
    "bilinear": {"size": {"height": SIZE, "width": SIZE}},
    "bicubic-imagenet": {
        "size": {"height": SIZE, "width": SIZE},
        "resample": 3,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
    },
}


def theirs(images: list[Image.Image], options: dict[str, Any]) -> torch.Tensor:
    out = reference.Gemma3ImageProcessorPil(**options)(images, return_tensors="pt")
    assert out["num_crops"].tolist() == [0] * len(images)
    values: torch.Tensor = out["pixel_values"]
    return values


@pytest.mark.parametrize("options", PROCESSORS.values(), ids=PROCESSORS.keys())
def test_pixel_values_equal_transformers(options: dict[str, Any]) -> None:
    config = ImageProcessorConfig.from_json(options, TOWER)
    for name, data in IMAGES.items():
        ours = preprocess_images([decode_image(data)], config).pixel_values
        expected = theirs([Image.open(io.BytesIO(data))], options)
        assert ours.shape == (1, 3, SIZE, SIZE)
        assert float((ours - expected).abs().max()) == 0.0, name


def test_several_images_stack_in_order() -> None:
    names = ["png-rgba-37x53", "jpeg-301x157", "png-gray-64x900"]
    options = PROCESSORS["bilinear"]
    images = [decode_image(IMAGES[name]) for name in names]
    inputs = preprocess_images(images, ImageProcessorConfig.from_json(options, TOWER))
    assert inputs.num_images == 3
    torch.testing.assert_close(inputs.pixel_values, theirs(images, options), rtol=0, atol=0)


def test_a_saved_processor_config_reads_back(tmp_path: Path) -> None:
    options = PROCESSORS["bicubic-imagenet"]
    reference.Gemma3ImageProcessorPil(**options).save_pretrained(tmp_path)
    config = ImageProcessorConfig.from_directory(tmp_path, TOWER)
    assert config == ImageProcessorConfig.from_json(options, TOWER)
    assert config.resample == 3
    assert config.image_std == pytest.approx((0.229, 0.224, 0.225))
    no_file = ImageProcessorConfig.from_directory(tmp_path / "missing", TOWER)
    assert no_file == ImageProcessorConfig(size=(SIZE, SIZE))


def test_published_nulls_read_as_the_defaults() -> None:
    """google/gemma-3-*'s preprocessor_config.json writes several steps as null."""
    published = {
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_pan_and_scan": None,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "resample": 2,
        "rescale_factor": 0.00392156862745098,
        "size": {"height": SIZE, "width": SIZE},
    }
    assert ImageProcessorConfig.from_json(published, TOWER) == ImageProcessorConfig(
        size=(SIZE, SIZE)
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"do_pan_and_scan": True}, "do_pan_and_scan true is not supported"),
        ({"do_convert_rgb": False}, "do_convert_rgb false is not supported"),
        ({"size": {"height": 32, "width": 32}}, "size 32x32 differs from the vision tower's"),
        ({"size": {"shortest_edge": SIZE}}, "size must be {height, width}"),
        ({"image_mean": "0.5"}, "image_mean must be numbers"),
        ({"resample": -1}, "resample must be an integer >= 0"),
    ],
)
def test_what_the_tower_cannot_take_is_refused_by_name(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ImageProcessorConfig.from_json({**PROCESSORS["bilinear"], **change}, TOWER)


def test_no_images_is_refused() -> None:
    with pytest.raises(ValueError, match="no images"):
        preprocess_images([], ImageProcessorConfig(size=(SIZE, SIZE)))
