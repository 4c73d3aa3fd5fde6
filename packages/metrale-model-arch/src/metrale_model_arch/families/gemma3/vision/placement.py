"""A prompt with images -> the input embeddings Gemma 3's text stack takes.

Each image token of the prompt (``siglip_vision.image_token_id``, ``mm_tokens_per_image`` of them
an image) takes the projector's next embedding, in prompt order, as it comes out (the text
stack's sqrt(hidden) scale is for text tokens only, as in transformers); every other token its
scaled text embedding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from metrale_model_arch.families.gemma3.vision.image_inputs import ImageInputs

if TYPE_CHECKING:
    from metrale_model_arch.families.gemma3.model import Gemma3ForConditionalGeneration


def prompt_embeds(
    model: Gemma3ForConditionalGeneration, input_ids: torch.Tensor, images: ImageInputs | None
) -> torch.Tensor:
    """``input_ids (tokens,)`` -> ``(tokens, hidden_size)`` for ``forward(inputs_embeds=...)``.

    Raises ``ValueError`` when the model has no tower, or the prompt's image tokens and the
    images' embeddings differ in number."""
    visual, vision = model.visual, model.config.siglip_vision
    if visual is None or vision is None:
        raise ValueError(f"{model.config.source}: this gemma3 model has no vision tower loaded")
    is_image = input_ids == vision.image_token_id
    num_image_tokens = int(is_image.sum())
    # The image token may lie past the vocabulary (transformers embeds token 0 in its place).
    embeds = model.embed(input_ids.masked_fill(is_image, 0))
    if images is None:
        if num_image_tokens:
            raise ValueError(f"the prompt has {num_image_tokens} image tokens but no images")
        return embeds
    expected = images.num_images * vision.mm_tokens_per_image
    if num_image_tokens != expected:
        raise ValueError(
            f"the prompt has {num_image_tokens} image tokens; its {images.num_images} image(s) "
            f"take {expected}"
        )
    features = visual(images.pixel_values).flatten(0, 1)
    return embeds.masked_scatter(is_image[:, None], features.to(embeds.dtype))
