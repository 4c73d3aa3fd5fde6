"""``ImageInputs``: a prompt's images as the tower takes them, and the tokens that place them."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch


@attrs.frozen(kw_only=True, eq=False)
class ImageInputs:
    """``pixel_values (patches, patch_dim)`` float32 of all images, in prompt order;
    ``grid_thw (images, 3)`` int64: each image's frames, rows and columns of patches."""

    pixel_values: torch.Tensor
    grid_thw: torch.Tensor

    @property
    def num_images(self) -> int:
        return int(self.grid_thw.shape[0])

    def num_tokens(self, merge_size: int) -> list[int]:
        """Image tokens (merged patches) each image takes in the prompt."""
        return [t * h * w // merge_size**2 for t, h, w in self.grid_thw.tolist()]


def expand_image_tokens(
    prompt: Sequence[int], image_token_id: int, num_tokens: Sequence[int]
) -> list[int]:
    """``prompt`` with its i-th ``image_token_id`` repeated ``num_tokens[i]`` times (what
    transformers' processor does to the chat template's one placeholder per image)."""
    expanded: list[int] = []
    counts = iter(num_tokens)
    for token in prompt:
        if token != image_token_id:
            expanded.append(token)
            continue
        count = next(counts, None)
        if count is None:
            raise ValueError(f"the prompt has more image placeholders than {len(num_tokens)}")
        expanded.extend([image_token_id] * count)
    if next(counts, None) is not None:
        raise ValueError(f"the prompt has fewer image placeholders than {len(num_tokens)} images")
    return expanded
