"""Weight plan of Gemma 3 (``gemma3``): ``gemma3_text``'s stack and head, and, where the config
has them, its SigLIP tower and projector (``weights.vision``, at the serve dtype)."""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig, SiglipVisionConfig
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.counts.dense_variants import dense_variant_param_counts


def gemma3_param_counts(config: ModelConfig) -> ParamCounts:
    counts = dense_variant_param_counts(config)
    vision = config.siglip_vision
    if vision is None:
        return counts
    tower = siglip_tower_params(vision) + projector_params(vision, config.hidden_size)
    return attrs.evolve(counts, vision=tower)


def siglip_tower_params(vision: SiglipVisionConfig) -> int:
    """Exactly as transformers' ``SiglipVisionModel`` without its pooling head."""
    hidden, inner = vision.hidden_size, vision.intermediate_size
    patch_embedding = vision.num_channels * vision.patch_size**2 * hidden + hidden
    position_embedding = vision.num_patches * hidden
    layer_norms = 2 * 2 * hidden  # weight and bias each
    attention = 4 * (hidden * hidden + hidden)  # q, k, v, out with biases
    mlp = hidden * inner + inner + inner * hidden + hidden  # fc1, fc2 with biases
    layers = vision.num_hidden_layers * (layer_norms + attention + mlp)
    post_layernorm = 2 * hidden
    return patch_embedding + position_embedding + layers + post_layernorm


def projector_params(vision: SiglipVisionConfig, text_hidden_size: int) -> int:
    """The projection matrix and the RMSNorm before it."""
    return vision.hidden_size * text_hidden_size + vision.hidden_size
