"""Weight plan of Qwen2.5-VL (``qwen2_5_vl``): the llama family's count of its Qwen2 text
stack, and its vision tower when the config declares one (:mod:`.qwen2_5_vl_vision`)."""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.counts.llama import llama_param_counts
from metrale_model_arch.counts.qwen2_5_vl_vision import qwen2_5_vl_vision_params


def qwen2_5_vl_param_counts(config: ModelConfig) -> ParamCounts:
    """Exactly as ``Qwen2_5_VLForCausalLM`` builds it."""
    vision = config.vision
    # No int8 path for this family yet (its record lists no int8 linears).
    return attrs.evolve(
        llama_param_counts(config),
        layers_int8_weights=0,
        layers_int8_rows=0,
        layers_projection_shapes=(),
        vision=qwen2_5_vl_vision_params(vision) if vision is not None else 0,
    )
