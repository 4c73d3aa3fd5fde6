"""GLM-5.3 (``glm5_next``): hyper-connections, DSA and KDA mixers, the MoE; see :mod:`.model`."""

from metrale_model_arch.families.glm5_next.mapping import glm5_next_checkpoint_mapping
from metrale_model_arch.families.glm5_next.model import Glm5NextForCausalLM

__all__ = ["Glm5NextForCausalLM", "glm5_next_checkpoint_mapping"]
