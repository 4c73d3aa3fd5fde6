"""Qwen3-Next: Gated DeltaNet and gated full attention, MoE with a gated shared expert, and its
multi-token-prediction layers (``mtp.*``, loaded for MTP speculation)."""

from metrale_model_arch.families.qwen3_next.mapping import qwen3_next_checkpoint_mapping
from metrale_model_arch.families.qwen3_next.model import Qwen3NextForCausalLM

__all__ = ["Qwen3NextForCausalLM", "qwen3_next_checkpoint_mapping"]
