"""``PromptPositions``: a prompt's multi-axis rotary positions (M-RoPE), fixed when the request
is made, and how the tokens decoded after it continue."""

from __future__ import annotations

import attrs
import torch


@attrs.frozen(kw_only=True, eq=False)
class PromptPositions:
    """``positions (3, tokens)`` int64: each prompt token's temporal, height and width
    position; ``delta``: what a later token's sequence index is shifted by (in all three
    rows)."""

    positions: torch.Tensor = attrs.field(repr=False)
    delta: int

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[1])
