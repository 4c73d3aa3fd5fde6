"""Qwen2.5-VL (``qwen2_5_vl``): a Qwen2 text stack with M-RoPE and a windowed vision tower; see
:mod:`.model`."""

from metrale_model_arch.families.qwen2_5_vl.mapping import qwen2_5_vl_checkpoint_mapping
from metrale_model_arch.families.qwen2_5_vl.model import Qwen2_5_VLForCausalLM

__all__ = ["Qwen2_5_VLForCausalLM", "qwen2_5_vl_checkpoint_mapping"]
