"""The checks GLM-5.3's and Qwen2.5-VL's preprocessing share against transformers' processor
(its PIL backend), bit for bit: ``pixel_values`` and ``image_grid_thw`` equal (max abs diff 0)
for each encoded file under each processor's options, for an EXIF-turned JPEG as
``load_image`` reads it, and for several images in one call.

A family's test module collects them as a class::

    class TestAgainstTransformers(GridPreprocessingChecks):
        preprocessing = GridPreprocessing(ConfigClass, TOWER, preprocess_images, reference)
        images = IMAGES  # name -> encoded file
        processors = PROCESSORS  # name -> preprocessor_config.json fields

Not imported by the plugin (torch and PIL at the top).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
import torch
from PIL import Image

from metrale_model_arch.families.vision.pixels import decode_image
from metrale_testing.image_files import rotated_jpeg

Options = Mapping[str, Any]
SEVERAL = ("png-rgba-37x53", "jpeg-301x157", "png-gray-64x900")


@attrs.frozen
class GridPreprocessing:
    """A family's processor config class (``from_json(fields, tower)``) over its ``tower``,
    its ``preprocess_images`` (to its ``ImageInputs``), and transformers' ``reference``
    processor class."""

    config_class: Any
    tower: Any
    preprocess_images: Callable[[list[Image.Image], Any], Any]
    reference: Callable[..., Any]

    def ours(self, files: list[bytes], options: Options) -> Any:
        images = [decode_image(data) for data in files]
        return self.preprocess_images(images, self.config_class.from_json(options, self.tower))

    def theirs(
        self, image: Image.Image | list[Image.Image], options: Options
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.reference(**options)(image, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"]


class GridPreprocessingChecks:
    preprocessing: ClassVar[GridPreprocessing]
    images: ClassVar[dict[str, bytes]]
    processors: ClassVar[dict[str, dict[str, Any]]]

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if metafunc.function.__name__ == "test_pixel_values_equal_transformers":
            metafunc.parametrize("name", list(self.images))
            metafunc.parametrize("options", self.processors.values(), ids=self.processors.keys())

    def test_pixel_values_equal_transformers(self, name: str, options: Options) -> None:
        data = self.images[name]
        inputs = self.preprocessing.ours([data], options)
        expected_values, expected_grid = self.preprocessing.theirs(
            Image.open(io.BytesIO(data)), options
        )
        assert inputs.grid_thw.tolist() == expected_grid.tolist()
        torch.testing.assert_close(inputs.pixel_values, expected_values, rtol=0, atol=0)

    def test_exif_orientation_is_applied_as_transformers_load_image(self, tmp_path: Path) -> None:
        from transformers.image_utils import load_image

        path = tmp_path / "rotated.jpeg"
        path.write_bytes(rotated_jpeg())
        inputs = self.preprocessing.ours([path.read_bytes()], {})
        expected_values, expected_grid = self.preprocessing.theirs(load_image(str(path)), {})
        assert inputs.grid_thw.tolist() == expected_grid.tolist()
        ((_, rows, cols),) = inputs.grid_thw.tolist()
        assert rows > cols  # 81 wide and 45 tall, turned upright
        torch.testing.assert_close(inputs.pixel_values, expected_values, rtol=0, atol=0)

    def test_several_images_concatenate_in_order(self) -> None:
        files = [self.images[name] for name in SEVERAL]
        inputs = self.preprocessing.ours(files, {})
        expected_values, expected_grid = self.preprocessing.theirs(
            [Image.open(io.BytesIO(data)) for data in files], {}
        )
        assert inputs.grid_thw.tolist() == expected_grid.tolist()
        torch.testing.assert_close(inputs.pixel_values, expected_values, rtol=0, atol=0)
        assert inputs.num_tokens(2) == [int(t * h * w) // 4 for t, h, w in expected_grid.tolist()]
