"""DeepSeek-V2 / V3 (``deepseek_v2``, ``deepseek_v3``): MLA attention and DeepSeek's MoE; see
:mod:`.model`."""

from metrale_model_arch.families.deepseek.mapping import deepseek_checkpoint_mapping
from metrale_model_arch.families.deepseek.model import DeepseekForCausalLM

__all__ = ["DeepseekForCausalLM", "deepseek_checkpoint_mapping"]
