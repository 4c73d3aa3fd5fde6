"""GLM-5.3's :class:`~metrale_model_arch.prepared_image.ImageEncoder`: its own preprocessing,
its tower run over a batch of images, its text embedding."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from PIL import Image

from metrale_model_arch.families.glm5_next.vision.preprocess import normalized_canvas, patchify
from metrale_model_arch.families.glm5_next.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.families.vision.grid_encode import GridImageEncoder
from metrale_model_arch.families.vision.tower_encoder import loaded_parts
from metrale_model_arch.prepared_image import PreparedImage

if TYPE_CHECKING:
    from metrale_model_arch.families.glm5_next.model import Glm5NextForCausalLM
    from metrale_model_arch.load import LoadedModel


class Glm5NextImageEncoder(GridImageEncoder["Glm5NextForCausalLM", ImageProcessorConfig]):
    def __init__(self, model: Glm5NextForCausalLM, processor: ImageProcessorConfig) -> None:
        super().__init__(model, model.model, model.config.vision, processor)

    @classmethod
    def for_loaded(cls, loaded: LoadedModel) -> Glm5NextImageEncoder:
        from metrale_model_arch.families.glm5_next.model import Glm5NextForCausalLM

        model, _, processor = loaded_parts(
            loaded, Glm5NextForCausalLM, loaded.config.vision, ImageProcessorConfig.from_directory
        )
        return cls(model, processor)

    @property
    def max_tokens_per_image(self) -> int:
        return self._processor.max_tokens_per_image

    def prepare(self, image: Image.Image) -> PreparedImage:
        patches, rows, cols = patchify(normalized_canvas(image, self._processor), self._processor)
        return PreparedImage(
            pixel_values=torch.from_numpy(patches),
            grid=(1, rows, cols),
            num_tokens=rows * cols // self._processor.merge_size**2,
        )
