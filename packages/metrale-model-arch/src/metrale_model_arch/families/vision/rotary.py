"""The vision towers' axial 2D rotary: each patch turns by its row and its column.

A head's first half rotates (as two halves, ``rotate_half``) with angles
``[row * f, col * f]`` repeated twice, ``f`` the ``head_dim // 4`` frequencies
``theta ** (-4i / head_dim)``. Patches run merge block by merge block (the order
:func:`~metrale_model_arch.families.vision.pixels.patchify` writes them in), so a patch's row
and column are computed from that order, not read from its index.
"""

from __future__ import annotations

import torch


def patch_positions(grid_thw: torch.Tensor, merge_size: int) -> torch.Tensor:
    """``(patches, 2)`` int64 ``(row, col)`` of every patch of ``grid_thw (images, 3)``, each
    image's frames repeating its grid."""
    rows = []
    for frames, height, width in grid_thw.tolist():
        row, col = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
        blocks = (height // merge_size, merge_size, width // merge_size, merge_size)
        row = row.reshape(blocks).transpose(1, 2).flatten()
        col = col.reshape(blocks).transpose(1, 2).flatten()
        rows.append(torch.stack([row, col], dim=-1).repeat(frames, 1))
    return torch.cat(rows)


def rotary_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``(patches, head_dim)`` float32, for :func:`patch_positions`."""
    half = head_dim // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, half, 2, dtype=torch.float32, device=device) / half)
    # (patches, 2, head_dim // 4) -> (patches, head_dim // 2): rows' angles, then columns'.
    angles = (positions.to(device)[..., None].float() * inv_freq).flatten(1)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x (patches, heads, head_dim)`` rotated in float32, returned in its dtype."""
    x32 = x.float()
    first, second = x32.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x32 * cos[:, None] + rotated * sin[:, None]).to(x.dtype)
