"""gpt-oss (``gpt_oss``): attention sinks, alternating sliding-window layers, a clamped-SwiGLU
MoE with biases; see :mod:`.model`."""

from metrale_model_arch.families.gpt_oss.mapping import gpt_oss_checkpoint_mapping
from metrale_model_arch.families.gpt_oss.model import GptOssForCausalLM

__all__ = ["GptOssForCausalLM", "gpt_oss_checkpoint_mapping"]
