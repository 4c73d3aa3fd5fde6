"""The batched encode of a tower over patch grids (GLM-5.3's, Qwen2.5-VL's): every image's
patches in one call with their ``(frames, rows, columns)`` grids, the merged tokens split back
per image."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from metrale_model_arch.prepared_image import PreparedImage


def encode_grid_images(
    visual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    images: Sequence[PreparedImage],
    dtype: torch.dtype,
) -> list[torch.Tensor]:
    """``(num_tokens, hidden)`` embeddings per image, in ``dtype``."""
    pixel_values = torch.cat([image.pixel_values for image in images])
    grid_thw = torch.tensor([image.grid for image in images], dtype=torch.int64)
    features = visual(pixel_values, grid_thw).to(dtype)
    return list(torch.split(features, [image.num_tokens for image in images]))
