"""Gemma 3's multi-modal projector: the tower's patches -> ``mm_tokens_per_image`` embeddings of
the text stack's width.

Each image's patch grid is average-pooled ``pool_size`` patches a side, normalized by Gemma's
RMSNorm (``1 + w``, in float32) and projected by a plain matrix (``(vision hidden, text
hidden)``, transformers' ``mm_input_projection_weight``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from metrale_config import SiglipVisionConfig
from metrale_kernels import KernelBackend
from metrale_model_arch.families.dense_variants import OffsetRMSNorm


class Gemma3MultiModalProjector(nn.Module):
    def __init__(
        self, vision: SiglipVisionConfig, text_hidden_size: int, backend: KernelBackend
    ) -> None:
        super().__init__()
        hidden = vision.hidden_size
        self.mm_input_projection_weight = nn.Parameter(torch.empty(hidden, text_hidden_size))
        self.mm_soft_emb_norm = OffsetRMSNorm(hidden, vision.layer_norm_eps, backend, offset=1.0)
        self.patches_per_side, self.pool_size = vision.patches_per_side, vision.pool_size

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """``(images, patches, vision hidden)`` -> ``(images, mm_tokens_per_image, text
        hidden)``, in ``patches``' dtype."""
        images, _, hidden = patches.shape
        side = self.patches_per_side
        grid = patches.transpose(1, 2).reshape(images, hidden, side, side)
        pooled = functional.avg_pool2d(grid, self.pool_size).flatten(2).transpose(1, 2)
        projected = torch.matmul(self.mm_soft_emb_norm(pooled), self.mm_input_projection_weight)
        return projected.to(patches.dtype)
