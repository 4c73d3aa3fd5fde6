"""Qwen2.5-VL's vision tower, its image preprocessing and the placement of its output in a
prompt."""

from metrale_model_arch.families.qwen2_5_vl.vision.placement import PromptInputs, prompt_inputs
from metrale_model_arch.families.qwen2_5_vl.vision.tower import Qwen2_5_VisionModel

__all__ = ["PromptInputs", "Qwen2_5_VisionModel", "prompt_inputs"]
