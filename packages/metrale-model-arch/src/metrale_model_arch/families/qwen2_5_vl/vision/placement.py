"""A prompt with images -> the input embeddings and positions Qwen2.5-VL's text stack takes.

Each image token of the prompt (``vision.image_token_id``, repeated once per merged patch; see
:func:`~metrale_model_arch.families.vision.image_inputs.expand_image_tokens`) takes the tower's
next embedding, in prompt order; every other token its text embedding. The positions are the
prompt's M-RoPE ones (:mod:`..positions`). Video input is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import torch

from metrale_model_arch.families.qwen2_5_vl.positions import prompt_positions
from metrale_model_arch.families.vision.image_inputs import ImageInputs
from metrale_model_arch.prompt_positions import PromptPositions

if TYPE_CHECKING:
    from metrale_model_arch.families.qwen2_5_vl.model import Qwen2_5_VLForCausalLM


@attrs.frozen(kw_only=True, eq=False)
class PromptInputs:
    """``embeds (tokens, hidden_size)`` for ``forward(inputs_embeds=...)``, and ``positions``:
    its ``(3, tokens)`` positions and the delta the tokens decoded after it continue from."""

    embeds: torch.Tensor
    positions: PromptPositions


def prompt_inputs(
    model: Qwen2_5_VLForCausalLM, input_ids: torch.Tensor, images: ImageInputs | None
) -> PromptInputs:
    """``input_ids (tokens,)`` of a whole prompt -> its embeddings and positions.

    Raises ``ValueError`` when the model has no tower, the prompt holds video tokens, or its
    image tokens and the images' merged patches differ in number."""
    visual, vision = model.model.visual, model.config.vision
    if visual is None or vision is None:
        raise ValueError(f"{model.config.source}: this qwen2_5_vl model has no vision tower")
    if vision.video_token_id is not None and bool((input_ids == vision.video_token_id).any()):
        raise ValueError("qwen2_5_vl: video input is not supported (the prompt holds video tokens)")
    merge = vision.spatial_merge_size
    embeds: torch.Tensor = model.model.embed_tokens(input_ids)
    is_image = input_ids == vision.image_token_id
    num_image_tokens = int(is_image.sum())
    if images is None and num_image_tokens:
        raise ValueError(f"the prompt has {num_image_tokens} image tokens but no images")
    expected = 0 if images is None else sum(images.num_tokens(merge))
    if images is not None and num_image_tokens != expected:
        raise ValueError(
            f"the prompt has {num_image_tokens} image tokens; its {images.num_images} image(s) "
            f"take {expected}"
        )
    grid_thw = None if images is None else images.grid_thw
    positions = prompt_positions(
        input_ids, grid_thw, image_token_id=vision.image_token_id, merge_size=merge
    )
    if images is not None:
        features = visual(images.pixel_values, images.grid_thw)
        embeds = embeds.masked_scatter(is_image[:, None], features.to(embeds.dtype))
    return PromptInputs(embeds=embeds, positions=positions)
