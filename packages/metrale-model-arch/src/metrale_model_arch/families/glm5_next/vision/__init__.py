"""GLM-5.3's vision tower, its image preprocessing and the placement of its output in a prompt."""

from metrale_model_arch.families.glm5_next.vision.image_inputs import (
    ImageInputs,
    expand_image_tokens,
)
from metrale_model_arch.families.glm5_next.vision.placement import prompt_embeds
from metrale_model_arch.families.glm5_next.vision.tower import Glm5NextVisionModel

__all__ = ["Glm5NextVisionModel", "ImageInputs", "expand_image_tokens", "prompt_embeds"]
