"""The image encoder's two terms: its output cache and the activations of one encoder batch.

The cache holds encoded images (``hidden_size`` values a token at the serve dtype) in pages of
``ENCODER_CACHE_PAGE_TOKENS`` tokens, allocated once at start: ``cache_tokens`` rounded up to
whole pages. The encoder runs images in batches of at most ``batch_tokens`` image tokens (a
larger image alone), each image some patches through the tower, whose live activations per
patch are the residual, a normed copy, q/k/v and their rotated q/k,
the attention output and the MLP's gate, up and activation (attention itself runs fused, never
materialising its scores), plus the float32 pixels. The activations are transient (as the
runtime headroom): planned, never a standing allocation.
"""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig

ENCODER_CACHE_PAGE_TOKENS = 16
FLOAT32_BYTES = 4


@attrs.frozen(kw_only=True)
class EncoderInputs:
    """What the plan reserves for serving images: ``max_tokens_per_image`` after
    preprocessing, ``cache_tokens`` of encoder output kept for reuse, at most ``batch_tokens``
    image tokens encoded in one tower forward (an image larger than that alone)."""

    max_tokens_per_image: int
    cache_tokens: int
    batch_tokens: int

    @property
    def encoder_batch_tokens(self) -> int:
        return max(self.batch_tokens, self.max_tokens_per_image)


def encoder_cache_pages(cache_tokens: int) -> int:
    return -(-cache_tokens // ENCODER_CACHE_PAGE_TOKENS)


def encoder_cache_bytes(config: ModelConfig, inputs: EncoderInputs, dtype_bytes: int) -> int:
    pages = encoder_cache_pages(inputs.cache_tokens)
    return pages * ENCODER_CACHE_PAGE_TOKENS * config.hidden_size * dtype_bytes


def encoder_activation_bytes(config: ModelConfig, inputs: EncoderInputs, dtype_bytes: int) -> int:
    """GLM-5.3's and Qwen2.5-VL's towers merge ``spatial_merge_size**2`` patches into a token;
    Gemma 3's SigLIP runs ``num_patches`` patches an image into ``mm_tokens_per_image``."""
    if config.vision is not None:
        vision = config.vision
        patches = inputs.encoder_batch_tokens * vision.spatial_merge_size**2
        hidden, intermediate, patch_dim = (
            vision.hidden_size,
            vision.intermediate_size,
            vision.patch_dim,
        )
    elif config.siglip_vision is not None:
        siglip = config.siglip_vision
        images = -(-inputs.encoder_batch_tokens // siglip.mm_tokens_per_image)
        patches = images * siglip.num_patches
        hidden, intermediate = siglip.hidden_size, siglip.intermediate_size
        patch_dim = siglip.num_channels * siglip.patch_size**2
    else:
        return 0
    per_patch = (8 * hidden + 3 * intermediate) * dtype_bytes + patch_dim * FLOAT32_BYTES
    return patches * per_patch
