"""``ImageInputs`` and ``expand_image_tokens``, shared by the vision families
(:mod:`metrale_model_arch.families.vision.image_inputs`), under GLM-5.3's name."""

from metrale_model_arch.families.vision.image_inputs import ImageInputs, expand_image_tokens

__all__ = ["ImageInputs", "expand_image_tokens"]
