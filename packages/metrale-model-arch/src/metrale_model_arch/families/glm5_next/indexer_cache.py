"""Where a DSA layer keeps its indexer keys between steps: one float32 row per token position
(float64 at a float64 serve).

The layer needs, for every complete pool ``j`` (positions ``jP .. jP+P-1``), its pooled key;
for the pool still filling, enough to finish the pooled key when its last token arrives. Both
live in the rows of the pool's own positions, so the cache costs ``index_head_dim`` float32
values per token whatever the layout:

- a complete pool: its pooled key in row ``jP``;
- a filling pool: the running per-channel softmax of what arrived so far, as the running max
  ``m`` (row ``jP``), sum ``s`` (row ``jP+1``) and weighted key sum ``w`` (row ``jP+2``). With
  ``P == 2`` only one token can be waiting, so ``s`` is 1 and ``w`` sits in row ``jP+1``.

Rows are found per sequence: in the paged layout through the sequence's block table (a pool
never straddles a block: the block size is a multiple of ``P``), in the flat layout at the
sequence's state slot, where a flag byte per row marks the rows that hold a pooled key.
"""

from __future__ import annotations

import torch

from metrale_kernels import KernelBackend, widened


class IndexerRows:
    """One sequence's rows of one DSA layer's indexer cache."""

    def __init__(
        self,
        keys: torch.Tensor,
        row_index: torch.Tensor | None,
        flags: torch.Tensor | None,
        kpool: int,
    ) -> None:
        # keys: (rows, index_head_dim) float32. row_index maps a position to its row (None: the
        # row is the position). flags: (rows,) uint8 in the flat layout.
        self.keys = keys
        self.row_index = row_index
        self.flags = flags
        self.kpool = kpool

    @classmethod
    def paged(
        cls, keys: torch.Tensor, block_table: torch.Tensor, block_size: int, kpool: int
    ) -> IndexerRows:
        """``keys (num_blocks, block_size, dim)`` read through ``block_table (blocks,)``."""
        offsets = torch.arange(block_size, device=block_table.device)
        row_index = (block_table[:, None] * block_size + offsets).flatten()
        return cls(keys.view(-1, keys.shape[-1]), row_index, None, kpool)

    @classmethod
    def flat(cls, keys: torch.Tensor, flags: torch.Tensor, kpool: int) -> IndexerRows:
        """``keys (capacity, dim)`` and ``flags (capacity,)`` of one state slot."""
        return cls(keys, None, flags, kpool)

    @property
    def capacity(self) -> int:
        """Positions the rows can hold."""
        return self.keys.shape[0] if self.row_index is None else self.row_index.shape[0]

    def _rows(self, positions: torch.Tensor) -> torch.Tensor:
        return positions if self.row_index is None else self.row_index[positions]

    def pooled_keys(self, num_pools: int) -> torch.Tensor:
        """The pooled keys of pools ``0 .. num_pools-1`` (all complete): ``(num_pools, dim)``."""
        positions = torch.arange(num_pools, device=self.keys.device) * self.kpool
        return self.keys.index_select(0, self._rows(positions))

    def append(
        self, start: int, keys: torch.Tensor, logits: torch.Tensor, backend: KernelBackend
    ) -> None:
        """Fold the tokens at positions ``start ..`` (``keys``, pooling ``logits`` with the
        position term added, each ``(tokens, dim)``) into their pools; a pool they complete
        gets its pooled key. Pools that cannot complete within the capacity are not kept."""
        pool, end, position = self.kpool, start + keys.shape[0], start
        if position % pool:
            stop = min(end, (position // pool + 1) * pool)
            self._fold(position, keys[: stop - start], logits[: stop - start])
            position = stop
        num_full = min(end - position, self.capacity - position) // pool
        if num_full > 0:
            offset = position - start
            count = num_full * pool
            shape = (num_full, pool, keys.shape[-1])
            pooled = backend.pool_index_keys(
                keys[offset : offset + count].reshape(shape),
                logits[offset : offset + count].reshape(shape),
            )
            self._write_pooled(position, pooled)
            position += count
        if position < end and position + pool <= self.capacity:
            self._fold(position, keys[position - start :], logits[position - start :])

    def _fold(self, position: int, keys: torch.Tensor, logits: torch.Tensor) -> None:
        """Tokens at ``position ..`` of one pool into its running softmax."""
        pool = self.kpool
        first = position - position % pool
        if first + pool > self.capacity:
            return
        logits = widened(logits)
        peak = logits.max(dim=0).values
        weights = torch.exp(logits - peak)
        total, weighted = weights.sum(dim=0), (weights * keys.to(weights.dtype)).sum(dim=0)
        rows = self._rows(torch.arange(first, first + min(pool, 3), device=keys.device))
        if position % pool:
            old_peak, old_total, old_weighted = self._running(rows)
            new_peak = torch.maximum(old_peak, peak)
            old_scale, scale = torch.exp(old_peak - new_peak), torch.exp(peak - new_peak)
            total = old_total * old_scale + total * scale
            weighted = old_weighted * old_scale + weighted * scale
            peak = new_peak
        if position + keys.shape[0] == first + pool:
            self._write_pooled(first, (weighted / total)[None])
        elif pool == 2:
            self.keys[rows] = torch.stack([peak, weighted])
        else:
            self.keys[rows] = torch.stack([peak, total, weighted])

    def _running(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        values = self.keys[rows]
        if self.kpool == 2:
            return values[0], torch.ones_like(values[0]), values[1]
        return values[0], values[1], values[2]

    def _write_pooled(self, position: int, pooled: torch.Tensor) -> None:
        positions = position + torch.arange(pooled.shape[0], device=pooled.device) * self.kpool
        rows = self._rows(positions)
        self.keys[rows] = pooled.to(self.keys.dtype)
        if self.flags is not None:
            self.flags[rows] = 1
