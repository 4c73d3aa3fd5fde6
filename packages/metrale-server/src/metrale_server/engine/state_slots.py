"""``StateSlots``: the per-sequence slot beside the block manager's paged pool.

A running sequence holds one slot id in ``0..num_slots-1`` from the moment it gets blocks until
it gives them back (finish, abort, preemption). The slot indexes everything that is per
sequence and not paged: its row of the persistent block table, and the state of layers whose
state is per sequence (linear attention, a flat indexer). Each assignment carries a fresh
ticket, so the owner of per-slot state resets it when a slot changes hands; a preempted
sequence gets a new slot on re-admission and its state is rebuilt by recompute.
"""

from __future__ import annotations

import itertools

from metrale_server.engine.sequence import Sequence


class StateSlots:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        # Lowest ids first, so a quiet engine keeps reusing the same few rows.
        self._free = list(range(num_slots - 1, -1, -1))
        self._tickets = itertools.count(1)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def assign(self, seq: Sequence) -> None:
        if seq.slot is not None:
            raise ValueError(f"{seq} already holds slot {seq.slot}")
        if not self._free:
            raise RuntimeError("no free state slot: more running sequences than slots")
        seq.slot = self._free.pop()
        seq.slot_ticket = next(self._tickets)

    def release(self, seq: Sequence) -> None:
        """Give back ``seq``'s slot; a sequence without one is left as it is."""
        if seq.slot is not None:
            self._free.append(seq.slot)
            seq.slot = None
