"""``ImageInputs``: a prompt's images as Gemma 3's tower takes them.

transformers' processor puts ``"\\n\\n<start_of_image>"``, ``mm_tokens_per_image`` image tokens
and ``"<end_of_image>\\n\\n"`` where the chat template writes ``<start_of_image>`` for an image,
then tokenizes; each image token then takes one of the projector's embeddings, in prompt order.
"""

from __future__ import annotations

import attrs
import torch


@attrs.frozen(kw_only=True, eq=False)
class ImageInputs:
    """``pixel_values (images, channels, image_size, image_size)`` float32, in prompt order."""

    pixel_values: torch.Tensor

    @property
    def num_images(self) -> int:
        return int(self.pixel_values.shape[0])
