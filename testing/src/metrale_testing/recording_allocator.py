"""An allocator for ``LoadOptions(allocator=...)`` that records the bytes it hands out per owner,
for the tests that hold a weight plan against the load's ledger (torch imported when called)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class RecordingAllocator:
    def __init__(self) -> None:
        self.bytes_by_owner: defaultdict[str, int] = defaultdict(int)

    def __call__(
        self, owner: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        import torch

        tensor = torch.empty(shape, dtype=dtype, device=device)
        self.bytes_by_owner[owner] += tensor.numel() * tensor.element_size()
        return tensor
