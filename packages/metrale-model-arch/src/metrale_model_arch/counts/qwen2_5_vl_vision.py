"""Weight plan of Qwen2.5-VL's vision tower (``model.visual``), from its ``vision_config``."""

from __future__ import annotations

from metrale_config import VisionConfig


def qwen2_5_vl_vision_params(vision: VisionConfig) -> int:
    """Exactly as transformers' ``Qwen2_5_VisionTransformerPretrainedModel`` (its rotary
    frequencies are not a weight)."""
    hidden = vision.hidden_size
    patch_embed = vision.patch_dim * hidden  # a convolution without bias
    return patch_embed + vision.depth * vision_block_params(vision) + merger_params(vision)


def vision_block_params(vision: VisionConfig) -> int:
    hidden, inner = vision.hidden_size, vision.intermediate_size
    norms = 2 * hidden  # norm1, norm2
    attention = 4 * hidden * hidden + 4 * hidden  # qkv, proj, with biases
    mlp = 3 * hidden * inner + 2 * inner + hidden  # gate, up, down, with biases
    return norms + attention + mlp


def merger_params(vision: VisionConfig) -> int:
    hidden, out = vision.hidden_size, vision.out_hidden_size
    width = hidden * vision.spatial_merge_size**2
    # ln_q over one patch, then two linear layers with biases over a merged block.
    return hidden + (width * width + width) + (width * out + out)
