"""GLM-5.3's vision tower: patches -> merged image embeddings the text stack takes.

A patch (``temporal_patch_size`` frames of ``patch_size`` squared pixels, one row of
``pixel_values``) is embedded by a convolution as wide as its stride, which is one matmul. Pre-norm
blocks (RMSNorm; attention with per-head q/k RMSNorm and the axial 2D rotary, within one frame of
one image; a clamped SwiGLU MLP with biases) run over all patches, then a final RMSNorm. Each
``spatial_merge_size`` squared block of patches is downsampled by a stride-wide convolution (one
matmul again) and the merger (a projection, LayerNorm, exact GELU, a clamped SwiGLU) gives one
``out_hidden_size`` embedding per block. Parameter names are transformers' under
``model.visual.``, with each gate/up pair fused (as the text stack's).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional

from metrale_config import VisionConfig
from metrale_kernels import KernelBackend
from metrale_kernels.reference.moe_experts import swiglu
from metrale_model_arch.families.glm5_next.mlp import ClampedSwiGluMlp
from metrale_model_arch.families.glm5_next.vision.rotary import (
    apply_rotary,
    patch_positions,
    rotary_cos_sin,
)
from metrale_model_arch.families.llama import RMSNorm

SUPPORTED_VISION_ACTS = ("silu",)


def _strided_conv_as_linear(conv: nn.Conv2d | nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
    """``x (n, in * kernel volume)``, laid out as the kernel is -> ``(n, out)``."""
    weight = conv.weight.reshape(conv.out_channels, -1)
    return functional.linear(x.to(weight.dtype), weight, conv.bias)


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).unsqueeze(0)


class PatchEmbed(nn.Module):
    def __init__(self, vision: VisionConfig) -> None:
        super().__init__()
        kernel = (vision.temporal_patch_size, vision.patch_size, vision.patch_size)
        self.proj = nn.Conv3d(vision.in_channels, vision.hidden_size, kernel, stride=kernel)


class VisionAttention(nn.Module):
    def __init__(self, vision: VisionConfig, backend: KernelBackend) -> None:
        super().__init__()
        self.num_heads, self.head_dim = vision.num_heads, vision.head_dim
        hidden, bias = vision.hidden_size, vision.attention_bias
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.proj = nn.Linear(hidden, hidden, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, vision.rms_norm_eps, backend)
        self.k_norm = RMSNorm(self.head_dim, vision.rms_norm_eps, backend)

    def forward(
        self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], segments: Sequence[int]
    ) -> torch.Tensor:
        num_patches = x.shape[0]
        q, k, v = self.qkv(x).view(num_patches, 3, self.num_heads * self.head_dim).unbind(1)
        q = self.q_norm(q.reshape(-1, self.head_dim)).view(num_patches, self.num_heads, -1)
        k = self.k_norm(k.reshape(-1, self.head_dim)).view(num_patches, self.num_heads, -1)
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        v = v.reshape(num_patches, self.num_heads, -1)
        outs = []
        sizes = list(segments)
        for q_s, k_s, v_s in zip(
            q.split_with_sizes(sizes),
            k.split_with_sizes(sizes),
            v.split_with_sizes(sizes),
            strict=True,
        ):
            # (1, heads, patches, head_dim): each frame of each image attends to itself only.
            out = functional.scaled_dot_product_attention(
                _heads_first(q_s), _heads_first(k_s), _heads_first(v_s)
            )
            outs.append(out[0].transpose(0, 1).reshape(-1, self.num_heads * self.head_dim))
        result: torch.Tensor = self.proj(torch.cat(outs))
        return result


class VisionBlock(nn.Module):
    def __init__(self, vision: VisionConfig, backend: KernelBackend) -> None:
        super().__init__()
        hidden, eps = vision.hidden_size, vision.rms_norm_eps
        self.norm1 = RMSNorm(hidden, eps, backend)
        self.norm2 = RMSNorm(hidden, eps, backend)
        self.attn = VisionAttention(vision, backend)
        self.mlp = ClampedSwiGluMlp(
            hidden, vision.intermediate_size, vision.swiglu_limit, bias=vision.attention_bias
        )

    def forward(
        self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], segments: Sequence[int]
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rotary, segments)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class PatchMerger(nn.Module):
    def __init__(self, vision: VisionConfig) -> None:
        super().__init__()
        dim, inner = vision.out_hidden_size, vision.projection_intermediate_size
        self.proj = nn.Linear(dim, dim, bias=False)
        self.post_projection_norm = nn.LayerNorm(dim)
        # gate rows, then up rows.
        self.gate_up_proj = nn.Linear(dim, 2 * inner, bias=False)
        self.down_proj = nn.Linear(inner, dim, bias=False)
        self.limit = vision.swiglu_limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = functional.gelu(self.post_projection_norm(self.proj(x)))
        out: torch.Tensor = self.down_proj(swiglu(self.gate_up_proj(x), self.limit))
        return out


class Glm5NextVisionModel(nn.Module):
    def __init__(self, vision: VisionConfig, backend: KernelBackend) -> None:
        super().__init__()
        if vision.hidden_act not in SUPPORTED_VISION_ACTS:
            raise ValueError(
                f"unsupported vision_config.hidden_act {vision.hidden_act!r}; "
                f"supported: {', '.join(SUPPORTED_VISION_ACTS)}"
            )
        self.vision = vision
        hidden, merge = vision.hidden_size, vision.spatial_merge_size
        self.patch_embed = PatchEmbed(vision)
        self.blocks = nn.ModuleList(VisionBlock(vision, backend) for _ in range(vision.depth))
        self.post_layernorm = RMSNorm(hidden, vision.rms_norm_eps, backend)
        self.downsample = nn.Conv2d(hidden, vision.out_hidden_size, merge, stride=merge)
        self.merger = PatchMerger(vision)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """``pixel_values (patches, patch_dim)`` of the images of ``grid_thw (images, 3)``
        (frames, rows, columns of patches) -> ``(patches / merge_size**2, out_hidden_size)``."""
        vision = self.vision
        expected = int(grid_thw.prod(dim=-1).sum())
        if pixel_values.shape != (expected, vision.patch_dim):
            raise ValueError(
                f"pixel_values has shape {tuple(pixel_values.shape)}; the grids "
                f"{grid_thw.tolist()} need ({expected}, {vision.patch_dim})"
            )
        device = self.downsample.weight.device
        positions = patch_positions(grid_thw, vision.spatial_merge_size)
        rotary = rotary_cos_sin(positions, vision.head_dim, vision.rope_theta, device)
        segments = [h * w for t, h, w in grid_thw.tolist() for _ in range(t)]
        x = _strided_conv_as_linear(self.patch_embed.proj, pixel_values.to(device))
        for block in self.blocks:
            x = block(x, rotary, segments)
        x = self.post_layernorm(x)
        merge = vision.spatial_merge_size
        # (blocks, merge, merge, hidden) -> (blocks, hidden, merge, merge), the kernel's layout.
        x = x.view(-1, merge, merge, x.shape[-1]).permute(0, 3, 1, 2).flatten(1)
        out: torch.Tensor = self.merger(_strided_conv_as_linear(self.downsample, x))
        return out
