"""Multimodal RoPE (M-RoPE): a token's rotary angles from its three positions.

Each of a head's ``head_dim // 2`` frequencies turns by one of the token's temporal, height and
width positions: the first ``mrope_section[0]`` frequencies by the temporal one, the next
``mrope_section[1]`` by the height, the rest by the width. A text token's three positions are
equal, so it turns as under plain RoPE: a ``(tokens,)`` position tensor is that case, read from
the plain table as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def mrope_cos_sin(
    cos_sin: torch.Tensor, positions: torch.Tensor, mrope_section: Sequence[int]
) -> torch.Tensor:
    """``positions (3, tokens)`` -> ``(tokens, rotary_dim)``: row ``i`` is token ``i``'s cos
    and sin, each column read from the plain table ``cos_sin (max_positions, rotary_dim)`` (cos,
    then sin) at the position of its frequency's section."""
    device = cos_sin.device
    sizes = torch.tensor(list(mrope_section), device=device)
    axis = torch.repeat_interleave(torch.arange(len(mrope_section), device=device), sizes)
    axis = torch.cat([axis, axis])  # the cos half, then the sin half
    columns = torch.arange(cos_sin.shape[-1], device=device)
    # (tokens, rotary_dim): token i, column j at positions[axis[j], i].
    return cos_sin[positions.to(device)[axis].t(), columns]
