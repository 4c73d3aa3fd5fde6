"""Gemma 3's SigLIP vision tower: ``(images, channels, size, size)`` pixels -> ``(images, patches,
hidden)``.

Each ``patch_size`` squared patch is embedded by a convolution as wide as its stride (one
matmul) plus its learned position embedding (patches in row-major order). Pre-norm encoder
layers (LayerNorm; attention with biases over all patches of one image; a tanh-GELU MLP), then a
final LayerNorm. Parameter names are transformers' ``SiglipVisionModel``'s; its pooling head
(``vision_use_head``) is not built: Gemma 3 reads the last hidden state.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from metrale_config import SiglipVisionConfig

SUPPORTED_VISION_ACTS = ("gelu_pytorch_tanh",)


class SiglipEmbeddings(nn.Module):
    def __init__(self, vision: SiglipVisionConfig) -> None:
        super().__init__()
        size, hidden = vision.patch_size, vision.hidden_size
        self.patch_size = size
        self.patch_embedding = nn.Conv2d(vision.num_channels, hidden, size, stride=size)
        self.position_embedding = nn.Embedding(vision.num_patches, hidden)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        images, channels, height, width = pixel_values.shape
        size = self.patch_size
        # (images, channels, rows, size, cols, size) -> (images, rows * cols, channels * size**2),
        # each patch laid out as the kernel is.
        patches = pixel_values.reshape(images, channels, height // size, size, width // size, size)
        patches = patches.permute(0, 2, 4, 1, 3, 5).flatten(3).flatten(1, 2)
        conv = self.patch_embedding
        weight = conv.weight.reshape(conv.out_channels, -1)
        embedded = functional.linear(patches.to(weight.dtype), weight, conv.bias)
        return embedded + self.position_embedding.weight


class SiglipAttention(nn.Module):
    def __init__(self, vision: SiglipVisionConfig) -> None:
        super().__init__()
        hidden = vision.hidden_size
        self.num_heads, self.head_dim = vision.num_attention_heads, vision.head_dim
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        images, patches, _ = x.shape
        # (images, heads, patches, head_dim): every patch of an image attends to all of them.
        q, k, v = (
            proj(x).view(images, patches, self.num_heads, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = functional.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5)
        result: torch.Tensor = self.out_proj(out.transpose(1, 2).reshape(images, patches, -1))
        return result


class SiglipMlp(nn.Module):
    def __init__(self, vision: SiglipVisionConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(vision.hidden_size, vision.intermediate_size)
        self.fc2 = nn.Linear(vision.intermediate_size, vision.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(functional.gelu(self.fc1(x), approximate="tanh"))
        return out


class SiglipEncoderLayer(nn.Module):
    def __init__(self, vision: SiglipVisionConfig) -> None:
        super().__init__()
        hidden, eps = vision.hidden_size, vision.layer_norm_eps
        self.layer_norm1 = nn.LayerNorm(hidden, eps=eps)
        self.self_attn = SiglipAttention(vision)
        self.layer_norm2 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = SiglipMlp(vision)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        out: torch.Tensor = x + self.mlp(self.layer_norm2(x))
        return out


class SiglipEncoder(nn.Module):
    def __init__(self, vision: SiglipVisionConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            SiglipEncoderLayer(vision) for _ in range(vision.num_hidden_layers)
        )


class SiglipVisionTower(nn.Module):
    def __init__(self, vision: SiglipVisionConfig) -> None:
        super().__init__()
        if vision.hidden_act not in SUPPORTED_VISION_ACTS:
            raise ValueError(
                f"unsupported vision_config.hidden_act {vision.hidden_act!r}; "
                f"supported: {', '.join(SUPPORTED_VISION_ACTS)}"
            )
        self.vision = vision
        self.embeddings = SiglipEmbeddings(vision)
        self.encoder = SiglipEncoder(vision)
        self.post_layernorm = nn.LayerNorm(vision.hidden_size, eps=vision.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``pixel_values (images, channels, image_size, image_size)`` -> ``(images, patches,
        hidden_size)``."""
        vision = self.vision
        expected = (vision.num_channels, vision.image_size, vision.image_size)
        if pixel_values.dim() != 4 or tuple(pixel_values.shape[1:]) != expected:
            raise ValueError(
                f"pixel_values has shape {tuple(pixel_values.shape)}; the tower takes "
                f"(images, {', '.join(map(str, expected))})"
            )
        device = self.post_layernorm.weight.device
        x = self.embeddings(pixel_values.to(device))
        for layer in self.encoder.layers:
            x = layer(x)
        out: torch.Tensor = self.post_layernorm(x)
        return out
