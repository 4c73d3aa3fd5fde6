"""Weight plan of GLM-5.3's vision tower (``model.visual``), from its ``vision_config`` alone."""

from __future__ import annotations

from metrale_config import VisionConfig


def vision_tower_params(vision: VisionConfig) -> int:
    """Exactly as transformers' ``Glm5NextVisionModel`` (its rotary table is not a weight)."""
    hidden, out = vision.hidden_size, vision.out_hidden_size
    patch_embed = vision.patch_dim * hidden + hidden  # a convolution with a bias
    blocks = vision.depth * vision_block_params(vision)
    post_layernorm = hidden
    downsample = hidden * vision.spatial_merge_size**2 * out + out  # a convolution with a bias
    return patch_embed + blocks + post_layernorm + downsample + merger_params(vision)


def vision_block_params(vision: VisionConfig) -> int:
    hidden, inner, bias = vision.hidden_size, vision.intermediate_size, vision.attention_bias
    norms = 2 * hidden + 2 * vision.head_dim  # norm1, norm2; q_norm, k_norm over a head
    attention = 4 * hidden * hidden + (4 * hidden if bias else 0)  # qkv, proj
    mlp = 3 * hidden * inner + ((2 * inner + hidden) if bias else 0)  # gate, up, down
    return norms + attention + mlp


def merger_params(vision: VisionConfig) -> int:
    dim, inner = vision.out_hidden_size, vision.projection_intermediate_size
    # proj, LayerNorm (weight and bias), gate, up, down: no biases.
    return dim * dim + 2 * dim + 3 * dim * inner
