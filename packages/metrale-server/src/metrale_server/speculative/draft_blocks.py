"""A draft pool's blocks, lent to the sequences that hold state slots.

Each state slot keeps the draft blocks of the sequence holding it, from the slot's assignment
until the scheduler frees the sequence (``release``); a slot that changed hands (a new
sequence, or a preempted one re-admitted) starts from nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import attrs


class DraftingSequence(Protocol):
    """What a proposer reads of a sequence (the engine's ``Sequence``): its tokens, and the
    state slot it holds with the ticket of that assignment."""

    token_ids: list[int]
    slot: int | None
    slot_ticket: int

    @property
    def num_tokens(self) -> int: ...


@attrs.define(eq=False)
class SlotBlocks:
    """The draft blocks of the sequence holding a slot at ``ticket``."""

    ticket: int
    blocks: list[int] = attrs.Factory(list)


CacheT = TypeVar("CacheT", bound=SlotBlocks)


class DraftBlocks(Generic[CacheT]):
    """``num_blocks`` draft blocks and one cache (a :class:`SlotBlocks`) per state slot."""

    def __init__(
        self,
        *,
        num_slots: int,
        num_blocks: int,
        block_size: int,
        new_cache: Callable[[int], CacheT],
    ) -> None:
        self.block_size = block_size
        self._new_cache = new_cache
        self._free_blocks = list(range(num_blocks - 1, -1, -1))
        self._slots: list[CacheT | None] = [None] * num_slots

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

    def find(self, seq: DraftingSequence) -> CacheT | None:
        """``seq``'s cache; ``None`` without a slot, or when the slot's cache is another's."""
        if seq.slot is None:
            return None
        cache = self._slots[seq.slot]
        return cache if cache is not None and cache.ticket == seq.slot_ticket else None

    def cache(self, seq: DraftingSequence) -> CacheT | None:
        """``seq``'s cache, a fresh one when its slot changed hands; ``None`` without a slot."""
        if seq.slot is None:
            return None
        cache = self.find(seq)
        if cache is None:
            self.release_slot(seq.slot)
            cache = self._slots[seq.slot] = self._new_cache(seq.slot_ticket)
        return cache

    def release(self, seq: DraftingSequence) -> None:
        """``seq`` gives back its slot: the draft blocks the slot holds return to the pool."""
        if self.find(seq) is not None:
            assert seq.slot is not None
            self.release_slot(seq.slot)

    def release_slot(self, slot: int) -> None:
        cache = self._slots[slot]
        if cache is not None:
            self.give_back(cache)
            self._slots[slot] = None

    def give_back(self, cache: SlotBlocks) -> None:
        self._free_blocks += reversed(cache.blocks)
        cache.blocks.clear()

    def grow(self, cache: SlotBlocks, num_positions: int) -> bool:
        """Give ``cache`` blocks for ``num_positions``; ``False`` (nothing taken) if the pool
        has too few."""
        needed = -(-num_positions // self.block_size) - len(cache.blocks)
        if needed > len(self._free_blocks):
            return False
        for _ in range(max(needed, 0)):
            cache.blocks.append(self._free_blocks.pop())
        return True
