"""Gemma 3 with images: ``gemma3_text``'s stack, a SigLIP tower and Gemma 3's projector."""

from metrale_model_arch.families.gemma3.mapping import gemma3_checkpoint_mapping
from metrale_model_arch.families.gemma3.model import Gemma3ForConditionalGeneration

__all__ = ["Gemma3ForConditionalGeneration", "gemma3_checkpoint_mapping"]
