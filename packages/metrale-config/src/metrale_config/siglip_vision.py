"""``SiglipVisionConfig``: Gemma 3's SigLIP vision tower and its projector onto the text stack."""

from __future__ import annotations

import math

import attrs


@attrs.frozen(kw_only=True)
class SiglipVisionConfig:
    """gemma3's ``vision_config`` (a SigLIP tower over ``image_size`` squared pixels cut into
    ``patch_size`` squared patches) and the top-level fields that place its output: the
    projector average-pools each image's patch grid to ``mm_tokens_per_image`` embeddings, each
    of which replaces one ``image_token_id`` of the prompt; transformers' processor wraps an
    image's tokens in ``boi_token_id`` ... ``eoi_token_id``.

    Invariants (checked by the parser): ``image_size`` is a multiple of ``patch_size``,
    ``hidden_size`` of ``num_attention_heads``; ``mm_tokens_per_image`` is a square whose side
    divides the patches a side.
    """

    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 16
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6
    mm_tokens_per_image: int = 256
    image_token_id: int
    boi_token_id: int
    eoi_token_id: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.patches_per_side**2

    @property
    def tokens_per_side(self) -> int:
        return math.isqrt(self.mm_tokens_per_image)

    @property
    def pool_size(self) -> int:
        """Patches a side that average into one image token."""
        return self.patches_per_side // self.tokens_per_side
