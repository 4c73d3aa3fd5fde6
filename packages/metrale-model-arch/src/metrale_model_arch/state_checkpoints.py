"""Per-slot checkpoints of the state a speculative step may leave wrong (see
:mod:`~metrale_model_arch.memory.spec_rollback`, which prices them).

``save`` copies, for each speculating sequence (its slot, the step's first position ``start``
and its block table), every linear-attention layer's recurrent and conv state and every DSA
layer's rows of the pool holding ``start``. ``restore`` puts them back: the state is then the
one after the first ``start`` tokens, and running them again from ``start`` makes it the state
after the kept tokens. Rows the step wrote past that pool are left: no read reaches them
before the tokens at their positions run again.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from metrale_config import ModelConfig
from metrale_model_arch.allocator import TensorAllocator
from metrale_model_arch.cache_spec import LinearAttentionSpec, SparseAttentionSpec
from metrale_model_arch.kv_cache import StateSlots
from metrale_model_arch.owners import SPEC_STATE_SNAPSHOT
from metrale_model_arch.registry import cache_specs


@attrs.frozen(kw_only=True)
class SlotPosition:
    """A sequence to checkpoint: its ``slot``, the step's first position ``start``, its
    ``block_table`` (the paged indexer's rows)."""

    slot: int
    start: int
    block_table: Sequence[int]


@attrs.define(eq=False)
class StateCheckpoints:
    """``linear``: (live ``(slots + dummy, ...)``, saved ``(slots, ...)``) per linear-state
    tensor; ``index_keys`` (per DSA layer: flat ``(slots, capacity, dim)`` or paged
    ``(num_blocks, block_size, dim)``) with ``saved_keys (layers, slots, kpool, dim)``, and the
    flat indexer's ``index_flags`` with ``saved_flags (layers, slots, kpool)``."""

    linear: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    index_keys: tuple[torch.Tensor, ...]
    index_flags: tuple[torch.Tensor, ...]
    saved_keys: torch.Tensor | None
    saved_flags: torch.Tensor | None
    kpool: int
    block_size: int
    is_flat: bool

    @property
    def is_empty(self) -> bool:
        return not self.linear and not self.index_keys

    def save(self, seqs: Sequence[SlotPosition]) -> None:
        if not seqs:
            return
        slots = torch.tensor([s.slot for s in seqs], device=self._device)
        for live, saved in self.linear:
            saved.index_copy_(0, slots, live.index_select(0, slots))
        kept = [s for s in seqs if self._pool_fits(s)]
        if not kept or self.saved_keys is None:
            return
        rows = self._pool_rows(kept)
        kept_slots = torch.tensor([s.slot for s in kept], device=self._device)
        for layer, keys in enumerate(self.index_keys):
            self.saved_keys[layer, kept_slots] = self._rows_of(keys, kept_slots, rows)
        for layer, flags in enumerate(self.index_flags):
            assert self.saved_flags is not None
            self.saved_flags[layer, kept_slots] = flags[kept_slots[:, None], rows]

    def restore(self, seqs: Sequence[SlotPosition]) -> None:
        if not seqs:
            return
        slots = torch.tensor([s.slot for s in seqs], device=self._device)
        for live, saved in self.linear:
            live.index_copy_(0, slots, saved.index_select(0, slots))
        kept = [s for s in seqs if self._pool_fits(s)]
        if kept and self.saved_keys is not None:
            rows = self._pool_rows(kept)
            kept_slots = torch.tensor([s.slot for s in kept], device=self._device)
            for layer, keys in enumerate(self.index_keys):
                self._write_rows(keys, kept_slots, rows, self.saved_keys[layer, kept_slots])
            for layer, flags in enumerate(self.index_flags):
                assert self.saved_flags is not None
                flags[kept_slots[:, None], rows] = self.saved_flags[layer, kept_slots]

    @property
    def _device(self) -> torch.device:
        tensors = [t for pair in self.linear for t in pair] + list(self.index_keys)
        return tensors[0].device

    def _first(self, seq: SlotPosition) -> int:
        return seq.start - seq.start % self.kpool

    def _pool_fits(self, seq: SlotPosition) -> bool:
        """Whether the pool holding ``start`` is stored at all (a flat cache holds whole pools
        up to its capacity)."""
        if not self.is_flat:
            return True
        return self._first(seq) + self.kpool <= self.index_keys[0].shape[1]

    def _pool_rows(self, seqs: Sequence[SlotPosition]) -> torch.Tensor:
        """``(seqs, kpool)`` row indices of each sequence's pool: positions in the flat layout,
        rows of the flattened pool in the paged one (a pool never straddles a block)."""
        offsets = torch.arange(self.kpool, device=self._device)
        if self.is_flat:
            firsts = [self._first(s) for s in seqs]
        else:
            size = self.block_size
            firsts = [
                s.block_table[self._first(s) // size] * size + self._first(s) % size for s in seqs
            ]
        return torch.tensor(firsts, device=self._device)[:, None] + offsets

    def _rows_of(self, keys: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if self.is_flat:
            return keys[slots[:, None], rows]
        return keys.view(-1, keys.shape[-1])[rows]

    def _write_rows(
        self, keys: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, values: torch.Tensor
    ) -> None:
        if self.is_flat:
            keys[slots[:, None], rows] = values
        else:
            keys.view(-1, keys.shape[-1])[rows] = values


def allocate_state_checkpoints(
    config: ModelConfig,
    *,
    seq_states: StateSlots,
    kv_caches: Sequence[tuple[torch.Tensor, ...]],
    num_slots: int,
    block_size: int,
    indexer_paged: bool,
    allocator: TensorAllocator,
) -> StateCheckpoints:
    """Checkpoints of ``num_slots`` slots for the state in ``seq_states`` (a ``StateSlots``)
    and the paged indexer keys in ``kv_caches`` (a ``KvCachePool``), charged to
    ``spec_state_snapshot``: exactly ``spec_checkpoint_reserve_bytes``."""
    specs = cache_specs(config, indexer_paged=indexer_paged)
    linear: list[tuple[torch.Tensor, torch.Tensor]] = []
    index_keys: list[torch.Tensor] = []
    index_flags: list[torch.Tensor] = []
    for layer, spec in enumerate(specs):
        if isinstance(spec, LinearAttentionSpec):
            for live in seq_states[layer]:
                saved = allocator(
                    SPEC_STATE_SNAPSHOT, (num_slots, *live.shape[1:]), live.dtype, live.device
                )
                linear.append((live, saved.zero_()))
        elif isinstance(spec, SparseAttentionSpec):
            if indexer_paged:
                index_keys.append(kv_caches[layer][1])
            else:
                keys, flags = seq_states[layer]
                index_keys.append(keys)
                index_flags.append(flags)
    saved_keys = saved_flags = None
    kpool = config.dsa.index_kpool if config.dsa is not None else 1
    if index_keys:
        first = index_keys[0]
        shape = (len(index_keys), num_slots, kpool, first.shape[-1])
        saved_keys = allocator(SPEC_STATE_SNAPSHOT, shape, first.dtype, first.device).zero_()
        if index_flags:
            saved_flags = allocator(SPEC_STATE_SNAPSHOT, shape[:-1], torch.uint8, first.device)
            saved_flags.zero_()
    return StateCheckpoints(
        linear=tuple(linear),
        index_keys=tuple(index_keys),
        index_flags=tuple(index_flags),
        saved_keys=saved_keys,
        saved_flags=saved_flags,
        kpool=kpool,
        block_size=block_size,
        is_flat=not indexer_paged,
    )
