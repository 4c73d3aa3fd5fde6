"""Gemma 3's vision part (SigLIP tower and projector), its image preprocessing and the placement
of its output in a prompt."""

from metrale_model_arch.families.gemma3.vision.image_inputs import ImageInputs
from metrale_model_arch.families.gemma3.vision.placement import prompt_embeds
from metrale_model_arch.families.gemma3.vision.visual import Gemma3Visual

__all__ = ["Gemma3Visual", "ImageInputs", "prompt_embeds"]
