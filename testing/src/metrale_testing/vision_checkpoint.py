"""A tiny random image checkpoint as transformers saves it (the model and its image processor),
with random images to prompt it with, and its load as one of our families. Not imported by the
plugin (torch and the metrale packages at the top)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import torch
from PIL import Image

from metrale_config import ModelConfig, model_config_from_hf_file
from metrale_model_arch import LoadOptions
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_testing.image_files import random_image

ModelT = TypeVar("ModelT")


@attrs.frozen(kw_only=True)
class VisionCheckpoint:
    path: Path
    config: ModelConfig
    hf_model: Any
    hf_processor: Any
    images: list[Image.Image]


def save_vision_checkpoint(
    path: Path, hf_model: Any, hf_processor: Any, image_sizes: Sequence[tuple[int, int]]
) -> VisionCheckpoint:
    """``hf_model`` (its weights made random) and ``hf_processor`` saved in ``path``, with a
    random image of each ``(height, width)``, seeded by its index."""
    hf_model.save_pretrained(path)
    hf_processor.save_pretrained(path)
    images = [random_image(h, w, seed) for seed, (h, w) in enumerate(image_sizes)]
    config = model_config_from_hf_file(path)
    return VisionCheckpoint(
        path=path, config=config, hf_model=hf_model, hf_processor=hf_processor, images=images
    )


def load_vision_model(
    checkpoint: VisionCheckpoint, model_class: type[ModelT], **options: Any
) -> ModelT:
    """The checkpoint loaded as ``model_class`` (float32 on the CPU unless ``options`` say)."""
    options = {"dtype": torch.float32, "device": "cpu", **options}
    model = load_safetensors_model(checkpoint.path, checkpoint.config, LoadOptions(**options))
    assert isinstance(model, model_class)
    return model
