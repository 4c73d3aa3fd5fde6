"""The allocation ledger: every long-lived allocation is made through it, tagged with its owner.

The ledger holds the base tensor of each allocation, so what it reports is what is live: the
weights, the RoPE table, the KV pool and the step arena for as long as the engine runs. Views
handed out (a column-major weight's transpose, a layer's K cache) share that storage and add
nothing. Thread-safe: ``/memory`` reads it from the event loop while the engine thread runs.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import torch


class MemoryLedger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tensors: dict[str, list[torch.Tensor]] = defaultdict(list)
        self._bytes: dict[str, int] = defaultdict(int)
        self._storages: set[int] = set()

    def allocate(
        self, owner: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A new uninitialised tensor charged to ``owner`` (``TensorAllocator`` protocol)."""
        tensor = torch.empty(shape, dtype=dtype, device=device)
        self._record(owner, tensor)
        return tensor

    def adopt(self, owner: str, tensor: torch.Tensor) -> None:
        """Charge ``owner`` for a tensor allocated elsewhere (a model loaded before the engine
        existed); its whole storage counts, once, whatever views share it."""
        self._record(owner, tensor, only_if_new=True)

    def release(self, owner: str) -> int:
        """Drop every allocation of ``owner``; returns the bytes released."""
        with self._lock:
            for tensor in self._tensors.pop(owner, []):
                self._storages.discard(tensor.untyped_storage().data_ptr())
            return self._bytes.pop(owner, 0)

    def live_bytes(self) -> int:
        with self._lock:
            return sum(self._bytes.values())

    def live_bytes_by_owner(self) -> dict[str, int]:
        with self._lock:
            return {owner: size for owner, size in self._bytes.items() if size}

    def _record(self, owner: str, tensor: torch.Tensor, *, only_if_new: bool = False) -> None:
        storage = tensor.untyped_storage()
        with self._lock:
            if only_if_new and storage.data_ptr() in self._storages:
                return
            self._storages.add(storage.data_ptr())
            self._tensors[owner].append(tensor)
            self._bytes[owner] += storage.nbytes()
