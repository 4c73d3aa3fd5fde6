"""Gemma 3's :class:`~metrale_model_arch.prepared_image.ImageEncoder`: its own preprocessing,
the SigLIP tower and projector over a batch of images, its scaled text embedding.

Gemma 3's prompts differ from GLM-5.3's in two ways the engine reads from here:
``text_expansion`` is what transformers' processor puts in the prompt text for each
``<start_of_image>`` the chat template writes (``"\\n\\n<start_of_image>"``, the image tokens,
``"<end_of_image>\\n\\n"``), tokenized with the rest; and ``whole_images``: an image's tokens
attend to each other, so the scheduler prefills each image within one step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from PIL import Image

from metrale_model_arch.families.gemma3.vision.preprocess import normalized_image
from metrale_model_arch.families.gemma3.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.families.gemma3.vision.visual import Gemma3Visual
from metrale_model_arch.families.vision.tower_encoder import TowerImageEncoder, loaded_parts
from metrale_model_arch.prepared_image import PreparedImage

if TYPE_CHECKING:
    from metrale_model_arch.families.gemma3.model import Gemma3ForConditionalGeneration
    from metrale_model_arch.load import LoadedModel


class Gemma3ImageEncoder(
    TowerImageEncoder["Gemma3ForConditionalGeneration", Gemma3Visual, ImageProcessorConfig]
):
    whole_images = True

    def __init__(
        self,
        model: Gemma3ForConditionalGeneration,
        processor: ImageProcessorConfig,
        token_text: dict[int, str],
    ) -> None:
        vision = model.config.siglip_vision
        super().__init__(model, model.visual, vision, processor)
        assert vision is not None
        self.max_tokens_per_image = vision.mm_tokens_per_image
        image, boi, eoi = (token_text[i] for i in (vision.image_token_id, vision.boi_token_id,
                                                    vision.eoi_token_id))  # fmt: skip
        self.placeholder_text = boi
        self.text_expansion = f"\n\n{boi}{image * vision.mm_tokens_per_image}{eoi}\n\n"

    @classmethod
    def for_loaded(cls, loaded: LoadedModel) -> Gemma3ImageEncoder:
        """The encoder of a loaded gemma3 model (its preprocessing read as
        :func:`loaded_parts` says), its image, begin- and end-of-image tokens' text from the
        tokenizer."""
        from metrale_model_arch.families.gemma3.model import Gemma3ForConditionalGeneration

        model, vision, processor = loaded_parts(
            loaded,
            Gemma3ForConditionalGeneration,
            loaded.config.siglip_vision,
            ImageProcessorConfig.from_directory,
        )
        token_text: dict[int, str] = {}
        for token_id in (vision.image_token_id, vision.boi_token_id, vision.eoi_token_id):
            text = loaded.tokenizer.id_to_token(token_id)
            if text is None:
                raise ValueError(f"gemma3: the tokenizer has no token {token_id} (an image token)")
            token_text[token_id] = text
        return cls(model, processor, token_text)

    def prepare(self, image: Image.Image) -> PreparedImage:
        height, width = self._processor.size
        return PreparedImage(
            pixel_values=torch.from_numpy(normalized_image(image, self._processor)),
            grid=(1, height, width),
            num_tokens=self.max_tokens_per_image,
        )

    def encode(self, images: Sequence[PreparedImage]) -> list[torch.Tensor]:
        pixel_values = torch.stack([image.pixel_values for image in images])
        dtype = self._model.model.embed_tokens.weight.dtype
        features = self._visual(pixel_values).to(dtype)
        return list(features.unbind(0))

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        # The image token may lie past the vocabulary: its rows are replaced anyway.
        is_image = input_ids == self.image_token_id
        return self._model.embed(input_ids.masked_fill(is_image, 0))
