"""Qwen2.5-VL's :class:`~metrale_model_arch.prepared_image.ImageEncoder`: its own preprocessing,
its windowed tower run over a batch of images, its text embedding, and the M-RoPE positions of
a prompt with images."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from PIL import Image

from metrale_model_arch.families.qwen2_5_vl.positions import prompt_positions
from metrale_model_arch.families.qwen2_5_vl.vision.preprocess import resized_pixels
from metrale_model_arch.families.qwen2_5_vl.vision.processor_config import (
    Qwen2VLImageProcessorConfig,
)
from metrale_model_arch.families.vision.grid_encode import GridImageEncoder
from metrale_model_arch.families.vision.pixels import patchify
from metrale_model_arch.families.vision.tower_encoder import loaded_parts
from metrale_model_arch.prepared_image import PreparedImage
from metrale_model_arch.prompt_positions import PromptPositions

if TYPE_CHECKING:
    from metrale_model_arch.families.qwen2_5_vl.model import Qwen2_5_VLForCausalLM
    from metrale_model_arch.load import LoadedModel


class Qwen2_5_VLImageEncoder(  # noqa: N801 (the family's name)
    GridImageEncoder["Qwen2_5_VLForCausalLM", Qwen2VLImageProcessorConfig]
):
    # The base's prompt layout: the chat template writes one image pad per image, expanded by
    # token (not in the text); image tokens attend causally, so a chunk may end inside an image.

    def __init__(
        self, model: Qwen2_5_VLForCausalLM, processor: Qwen2VLImageProcessorConfig
    ) -> None:
        super().__init__(model, model.model, model.config.vision, processor)
        self.max_tokens_per_image = processor.max_tokens_per_image

    @classmethod
    def for_loaded(cls, loaded: LoadedModel) -> Qwen2_5_VLImageEncoder:
        from metrale_model_arch.families.qwen2_5_vl.model import Qwen2_5_VLForCausalLM

        model, _, processor = loaded_parts(
            loaded,
            Qwen2_5_VLForCausalLM,
            loaded.config.vision,
            Qwen2VLImageProcessorConfig.from_directory,
        )
        return cls(model, processor)

    def prepare(self, image: Image.Image) -> PreparedImage:
        processor = self._processor
        patches, rows, cols = patchify(
            resized_pixels(image, processor),
            patch_size=processor.patch_size,
            merge_size=processor.merge_size,
            temporal_patch_size=processor.temporal_patch_size,
        )
        num_tokens = rows * cols // processor.merge_size**2
        if num_tokens > self.max_tokens_per_image:
            # NOTE: smart_resize keeps a short side of one merged patch at least, so a thin
            # image can pass max_pixels (transformers resizes it so too).
            raise ValueError(
                f"the image resizes to {rows * processor.patch_size}x{cols * processor.patch_size}"
                f" pixels, {num_tokens} image tokens; the server planned for "
                f"{self.max_tokens_per_image} ({processor.max_pixels} pixels at most)"
            )
        pixel_values = torch.from_numpy(patches)
        grid = (1, rows, cols)
        return PreparedImage(
            pixel_values=pixel_values,
            grid=grid,
            num_tokens=num_tokens,
        )

    def rope_positions(
        self, token_ids: Sequence[int], images: Sequence[PreparedImage]
    ) -> PromptPositions | None:
        """``None`` for a prompt without images (its M-RoPE positions are its indices)."""
        if not images:
            return None
        return prompt_positions(
            token_ids,
            torch.tensor([image.grid for image in images], dtype=torch.int64),
            image_token_id=self.image_token_id,
            merge_size=self._processor.merge_size,
        )
