"""``EncoderCache``: encoded images kept by digest, so a repeated image is not encoded again.

The cache is one tensor allocated at start (the plan's ``encoder_cache`` owner): pages of
``ENCODER_CACHE_PAGE_TOKENS`` image tokens. An image takes whole pages, any of them, so freeing
one never fragments the others; when the free pages are too few, the least recently used
images are dropped. An image larger than the whole cache is never kept (it is encoded each
time it is needed).
"""

from __future__ import annotations

from collections import OrderedDict

import attrs
import torch

from metrale_model_arch import TensorAllocator
from metrale_model_arch.memory import (
    ENCODER_CACHE,
    ENCODER_CACHE_PAGE_TOKENS,
    encoder_cache_pages,
)


@attrs.frozen
class _Entry:
    pages: torch.Tensor  # int64 page ids
    num_tokens: int


class EncoderCache:
    def __init__(
        self,
        *,
        cache_tokens: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        allocator: TensorAllocator,
    ) -> None:
        num_pages = encoder_cache_pages(cache_tokens)
        shape = (num_pages, ENCODER_CACHE_PAGE_TOKENS, hidden_size)
        self.pages = allocator(ENCODER_CACHE, shape, dtype, device)
        self._free = list(range(num_pages))
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    @property
    def num_pages(self) -> int:
        return int(self.pages.shape[0])

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def __contains__(self, digest: str) -> bool:
        return digest in self._entries

    def get(self, digest: str) -> torch.Tensor | None:
        """The image's ``(num_tokens, hidden)`` embeddings (a copy), or ``None``."""
        entry = self._entries.get(digest)
        if entry is None:
            return None
        self._entries.move_to_end(digest)
        rows = self.pages.index_select(0, entry.pages).flatten(0, 1)
        return rows[: entry.num_tokens]

    def put(self, digest: str, embeddings: torch.Tensor) -> bool:
        """Keep ``embeddings (num_tokens, hidden)`` under ``digest``, dropping the least
        recently used images as needed; false when the image is larger than the cache."""
        if digest in self._entries:
            self._entries.move_to_end(digest)
            return True
        num_tokens = int(embeddings.shape[0])
        needed = -(-num_tokens // ENCODER_CACHE_PAGE_TOKENS)
        if needed > self.num_pages:
            return False
        while len(self._free) < needed:
            _, dropped = self._entries.popitem(last=False)
            self._free += dropped.pages.tolist()
        taken, self._free = self._free[:needed], self._free[needed:]
        pages = torch.tensor(taken, dtype=torch.int64, device=self.pages.device)
        padded = embeddings.new_zeros((needed * ENCODER_CACHE_PAGE_TOKENS, embeddings.shape[1]))
        padded[:num_tokens] = embeddings
        self.pages.index_copy_(0, pages, padded.view(needed, ENCODER_CACHE_PAGE_TOKENS, -1))
        self._entries[digest] = _Entry(pages=pages, num_tokens=num_tokens)
        return True
