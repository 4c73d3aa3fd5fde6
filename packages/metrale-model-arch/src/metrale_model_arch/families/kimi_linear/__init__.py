"""Kimi Linear (``kimi_linear``): KDA linear attention and NoPE MLA layers, DeepSeek-V3's MoE;
see :mod:`.model`."""

from metrale_model_arch.families.kimi_linear.mapping import kimi_linear_checkpoint_mapping
from metrale_model_arch.families.kimi_linear.model import KimiLinearForCausalLM

__all__ = ["KimiLinearForCausalLM", "kimi_linear_checkpoint_mapping"]
