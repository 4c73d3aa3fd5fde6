"""A prompt with images -> the input embeddings GLM-5.3's text stack takes.

Each image token of the prompt (``vision.image_token_id``, repeated once per merged patch; see
:func:`~metrale_model_arch.families.glm5_next.vision.image_inputs.expand_image_tokens`) takes
the tower's next embedding, in prompt order; every other token its text embedding. Positions stay
``0, 1, 2...``: the text stack has no position encoding (transformers' model passes the plain
range too). Video (image tokens inside a video start/end span) is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from metrale_model_arch.families.glm5_next.vision.image_inputs import ImageInputs

if TYPE_CHECKING:
    from metrale_model_arch.families.glm5_next.model import Glm5NextForCausalLM


def prompt_embeds(
    model: Glm5NextForCausalLM, input_ids: torch.Tensor, images: ImageInputs | None
) -> torch.Tensor:
    """``input_ids (tokens,)`` -> ``(tokens, hidden_size)`` for ``forward(inputs_embeds=...)``.

    Raises ``ValueError`` when the model has no tower, the prompt holds a video span, or its
    image tokens and the images' merged patches differ in number."""
    visual, vision = model.model.visual, model.config.vision
    if visual is None or vision is None:
        raise ValueError(f"{model.config.source}: this glm5_next checkpoint has no vision tower")
    if vision.video_start_token_id is not None and bool(
        (input_ids == vision.video_start_token_id).any()
    ):
        raise ValueError("glm5_next: video input is not supported (the prompt opens a video)")
    embeds: torch.Tensor = model.model.embed_tokens(input_ids)
    is_image = input_ids == vision.image_token_id
    num_image_tokens = int(is_image.sum())
    if images is None:
        if num_image_tokens:
            raise ValueError(f"the prompt has {num_image_tokens} image tokens but no images")
        return embeds
    expected = sum(images.num_tokens(vision.spatial_merge_size))
    if num_image_tokens != expected:
        raise ValueError(
            f"the prompt has {num_image_tokens} image tokens; its {images.num_images} image(s) "
            f"take {expected}"
        )
    features = visual(images.pixel_values, images.grid_thw)
    return embeds.masked_scatter(is_image[:, None], features.to(embeds.dtype))
