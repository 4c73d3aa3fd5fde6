"""``Gemma3Visual`` (``model.visual``): pixels -> the text stack's image embeddings."""

from __future__ import annotations

import torch
from torch import nn

from metrale_config import SiglipVisionConfig
from metrale_kernels import KernelBackend
from metrale_model_arch.families.gemma3.vision.projector import Gemma3MultiModalProjector
from metrale_model_arch.families.gemma3.vision.tower import SiglipVisionTower


class Gemma3Visual(nn.Module):
    """The SigLIP tower, then the projector: ``mm_tokens_per_image`` embeddings an image."""

    def __init__(
        self, vision: SiglipVisionConfig, text_hidden_size: int, backend: KernelBackend
    ) -> None:
        super().__init__()
        self.vision_tower = SiglipVisionTower(vision)
        self.multi_modal_projector = Gemma3MultiModalProjector(vision, text_hidden_size, backend)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``(images, channels, size, size)`` -> ``(images, mm_tokens_per_image, text hidden)``."""
        out: torch.Tensor = self.multi_modal_projector(self.vision_tower(pixel_values))
        return out
