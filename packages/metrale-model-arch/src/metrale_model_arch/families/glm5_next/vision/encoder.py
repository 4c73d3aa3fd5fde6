"""GLM-5.3's :class:`~metrale_model_arch.prepared_image.ImageEncoder`: its own preprocessing,
its tower run over a batch of images, its text embedding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from PIL import Image

from metrale_model_arch.families.glm5_next.vision.preprocess import normalized_canvas, patchify
from metrale_model_arch.families.glm5_next.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.families.vision.grid_encode import encode_grid_images
from metrale_model_arch.families.vision.processor_fields import checkpoint_directory
from metrale_model_arch.prepared_image import PreparedImage
from metrale_model_arch.prompt_positions import PromptPositions

if TYPE_CHECKING:
    from metrale_model_arch.families.glm5_next.model import Glm5NextForCausalLM
    from metrale_model_arch.load import LoadedModel


class Glm5NextImageEncoder:
    placeholder_text: str | None = None
    text_expansion: str | None = None
    whole_images = False

    def __init__(self, model: Glm5NextForCausalLM, processor: ImageProcessorConfig) -> None:
        vision = model.config.vision
        if model.model.visual is None or vision is None:
            raise ValueError(f"{model.config.source}: the model was loaded without its tower")
        self._model = model
        self._visual = model.model.visual
        self._processor = processor
        self.image_token_id = vision.image_token_id
        self.hidden_size = model.config.hidden_size
        self._merge_size = vision.spatial_merge_size

    @classmethod
    def for_loaded(cls, loaded: LoadedModel) -> Glm5NextImageEncoder:
        """The encoder of a loaded glm5_next model, its preprocessing read from the
        checkpoint directory's ``preprocessor_config.json`` (defaults without one)."""
        from metrale_model_arch.families.glm5_next.model import Glm5NextForCausalLM

        model, vision = loaded.model, loaded.config.vision
        assert isinstance(model, Glm5NextForCausalLM)
        assert vision is not None
        return cls(model, ImageProcessorConfig.from_directory(checkpoint_directory(loaded), vision))

    @property
    def max_tokens_per_image(self) -> int:
        return self._processor.max_tokens_per_image

    def prepare(self, image: Image.Image) -> PreparedImage:
        patches, rows, cols = patchify(normalized_canvas(image, self._processor), self._processor)
        pixel_values = torch.from_numpy(patches)
        grid = (1, rows, cols)
        return PreparedImage(
            pixel_values=pixel_values,
            grid=grid,
            num_tokens=rows * cols // self._merge_size**2,
        )

    def encode(self, images: Sequence[PreparedImage]) -> list[torch.Tensor]:
        dtype = self._model.model.embed_tokens.weight.dtype
        return encode_grid_images(self._visual, images, dtype)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        embeds: torch.Tensor = self._model.model.embed_tokens(input_ids)
        return embeds

    def rope_positions(
        self, token_ids: Sequence[int], images: Sequence[PreparedImage]
    ) -> PromptPositions | None:
        del token_ids, images  # GLM-5.3 places every token at its index
        return None
