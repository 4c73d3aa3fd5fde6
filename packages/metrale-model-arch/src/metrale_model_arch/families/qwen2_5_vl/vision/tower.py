"""Qwen2.5-VL's vision tower: patches -> merged image embeddings the text stack takes.

A patch (``temporal_patch_size`` frames of ``patch_size`` squared pixels, one row of
``pixel_values``) is embedded by a bias-free convolution as wide as its stride, which is one
matmul. The patches are reordered window by window (:mod:`.windows`); pre-norm blocks (RMSNorm;
attention with the axial 2D rotary, within one window, or within one frame of one image for the
blocks in ``fullatt_block_indexes``; a SwiGLU MLP with biases) run over them. The merger
(RMSNorm, then each ``spatial_merge_size`` squared block of patches flattened through a
``Linear``, exact GELU, ``Linear``) gives one ``out_hidden_size`` embedding per block, put back
in the blocks' first order. Parameter names are transformers' under ``model.visual.``, each
gate/up pair fused (as the text stack's).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional

from metrale_config import VisionConfig
from metrale_kernels import KernelBackend
from metrale_model_arch.families.glm5_next.mlp import ClampedSwiGluMlp
from metrale_model_arch.families.llama import RMSNorm
from metrale_model_arch.families.qwen2_5_vl.vision.windows import window_order
from metrale_model_arch.families.vision.rotary import (
    apply_rotary,
    patch_positions,
    rotary_cos_sin,
)

SUPPORTED_VISION_ACTS = ("silu",)
Rotary = tuple[torch.Tensor, torch.Tensor]


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).unsqueeze(0)


class PatchEmbed(nn.Module):
    def __init__(self, vision: VisionConfig) -> None:
        super().__init__()
        kernel = (vision.temporal_patch_size, vision.patch_size, vision.patch_size)
        self.proj = nn.Conv3d(
            vision.in_channels, vision.hidden_size, kernel, stride=kernel, bias=False
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``(patches, patch_dim)``, laid out as the kernel is -> ``(patches, hidden)``."""
        weight = self.proj.weight.reshape(self.proj.out_channels, -1)
        return functional.linear(pixel_values.to(weight.dtype), weight)


class VisionAttention(nn.Module):
    def __init__(self, vision: VisionConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = vision.num_heads, vision.head_dim
        self.qkv = nn.Linear(vision.hidden_size, 3 * vision.hidden_size)
        self.proj = nn.Linear(vision.hidden_size, vision.hidden_size)

    def forward(self, x: torch.Tensor, rotary: Rotary, segments: Sequence[int]) -> torch.Tensor:
        num_patches = x.shape[0]
        q, k, v = self.qkv(x).view(num_patches, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        sizes = list(segments)
        outs = [
            # (1, heads, patches, head_dim): each segment attends to itself only.
            functional.scaled_dot_product_attention(
                _heads_first(q_s), _heads_first(k_s), _heads_first(v_s)
            )[0].transpose(0, 1)
            for q_s, k_s, v_s in zip(
                q.split_with_sizes(sizes),
                k.split_with_sizes(sizes),
                v.split_with_sizes(sizes),
                strict=True,
            )
        ]
        out: torch.Tensor = self.proj(torch.cat(outs).reshape(num_patches, -1))
        return out


class VisionBlock(nn.Module):
    def __init__(self, vision: VisionConfig, backend: KernelBackend) -> None:
        super().__init__()
        hidden, eps = vision.hidden_size, vision.rms_norm_eps
        self.norm1 = RMSNorm(hidden, eps, backend)
        self.norm2 = RMSNorm(hidden, eps, backend)
        self.attn = VisionAttention(vision)
        self.mlp = ClampedSwiGluMlp(hidden, vision.intermediate_size, None, bias=True)

    def forward(self, x: torch.Tensor, rotary: Rotary, segments: Sequence[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rotary, segments)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class PatchMerger(nn.Module):
    def __init__(self, vision: VisionConfig, backend: KernelBackend) -> None:
        super().__init__()
        self.width = vision.hidden_size * vision.spatial_merge_size**2
        self.ln_q = RMSNorm(vision.hidden_size, vision.rms_norm_eps, backend)
        self.mlp = nn.Sequential(
            nn.Linear(self.width, self.width),
            nn.GELU(),
            nn.Linear(self.width, vision.out_hidden_size),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mlp(self.ln_q(x).view(-1, self.width))
        return out


class Qwen2_5_VisionModel(nn.Module):  # noqa: N801 (transformers' name)
    def __init__(self, vision: VisionConfig, backend: KernelBackend) -> None:
        super().__init__()
        if vision.hidden_act not in SUPPORTED_VISION_ACTS:
            raise ValueError(
                f"unsupported vision_config.hidden_act {vision.hidden_act!r}; "
                f"supported: {', '.join(SUPPORTED_VISION_ACTS)}"
            )
        if vision.window_size is None:
            raise ValueError("qwen2_5_vl's vision_config needs a window_size")
        self.vision = vision
        self.window_blocks = vision.window_size // (vision.spatial_merge_size * vision.patch_size)
        self.full_attention_blocks = frozenset(vision.fullatt_block_indexes)
        self.patch_embed = PatchEmbed(vision)
        self.blocks = nn.ModuleList(VisionBlock(vision, backend) for _ in range(vision.depth))
        self.merger = PatchMerger(vision, backend)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """``pixel_values (patches, patch_dim)`` of the images of ``grid_thw (images, 3)``
        (frames, rows, columns of patches) -> ``(patches / merge_size**2, out_hidden_size)``,
        in ``pixel_values``' order."""
        vision = self.vision
        expected = int(grid_thw.prod(dim=-1).sum())
        if pixel_values.shape != (expected, vision.patch_dim):
            raise ValueError(
                f"pixel_values has shape {tuple(pixel_values.shape)}; the grids "
                f"{grid_thw.tolist()} need ({expected}, {vision.patch_dim})"
            )
        merge_unit = vision.spatial_merge_size**2
        device = self.patch_embed.proj.weight.device
        windows = window_order(grid_thw, vision.spatial_merge_size, self.window_blocks)
        # Each merge block's patches stay together, in their order.
        patch_order = (windows.blocks[:, None] * merge_unit + torch.arange(merge_unit)).flatten()
        positions = patch_positions(grid_thw, vision.spatial_merge_size)[patch_order]
        rotary = rotary_cos_sin(positions, vision.head_dim, vision.rope_theta, device)
        frames = [h * w for t, h, w in grid_thw.tolist() for _ in range(t)]
        window_patches = [size * merge_unit for size in windows.window_sizes]
        x = self.patch_embed(pixel_values.to(device)[patch_order.to(device)])
        for index, block in enumerate(self.blocks):
            is_full = index in self.full_attention_blocks
            x = block(x, rotary, frames if is_full else window_patches)
        merged = self.merger(x)
        out = torch.empty_like(merged)
        out[windows.blocks.to(device)] = merged
        return out
