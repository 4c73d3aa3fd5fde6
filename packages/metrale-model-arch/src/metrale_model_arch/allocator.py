"""How model-arch asks for long-lived memory: through an allocator that learns each owner.

The server passes its allocation ledger; standalone use gets plain ``torch.empty``.
"""

from __future__ import annotations

from typing import Protocol

import torch


class TensorAllocator(Protocol):
    def __call__(
        self, owner: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A new, uninitialised tensor owned by ``owner`` (e.g. ``weights.layers``)."""
        ...


def plain_allocator(
    owner: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)
