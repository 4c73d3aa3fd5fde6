"""The persistent block table and state slots: rows follow the block manager's tables."""

from __future__ import annotations

import pytest
import torch

from metrale_server.engine.block_table import PersistentBlockTable
from metrale_server.engine.sequence import Sequence
from metrale_server.engine.state_slots import StateSlots
from metrale_server.sampling.params import SamplingParams


def seq(seq_id: int) -> Sequence:
    return Sequence(
        seq_id=seq_id,
        request_id=f"r{seq_id}",
        prompt_token_ids=(1, 2, 3),
        params=SamplingParams(),
        arrival_time=0.0,
    )


def test_slots_are_reused_lowest_first_with_a_new_ticket_each_time() -> None:
    slots = StateSlots(2)
    a, b, c = seq(0), seq(1), seq(2)
    slots.assign(a)
    slots.assign(b)
    assert (a.slot, b.slot, slots.num_free) == (0, 1, 0)
    with pytest.raises(RuntimeError, match="no free state slot"):
        slots.assign(c)
    ticket = a.slot_ticket
    slots.release(a)
    slots.release(a)  # a second release is a no-op
    slots.assign(c)
    assert (a.slot, c.slot) == (None, 0)
    assert c.slot_ticket > ticket
    with pytest.raises(ValueError, match="already holds"):
        slots.assign(c)


def test_rows_are_written_incrementally_and_rewritten_when_a_slot_changes_hands() -> None:
    slots = StateSlots(2)
    table = PersistentBlockTable(torch.full((2, 4), -1, dtype=torch.int64))
    a = seq(0)
    slots.assign(a)
    a.block_table = [5, 6]
    assert table.sync(a) == 0
    assert table.flush() == [0]  # a new owner: its per-slot state is reset by the runner
    assert table.table[0].tolist() == [5, 6, -1, -1]

    # A copy-on-write replaced the last block and a new block arrived: both are written.
    a.block_table = [5, 9, 7]
    table.table[0, 0] = 42  # a stale entry the sync must not touch (only the tail is written)
    table.sync(a)
    assert table.flush() == []
    assert table.table[0].tolist() == [42, 9, 7, -1]

    slots.release(a)
    b = seq(1)
    slots.assign(b)  # the same row, a new ticket: written from scratch
    b.block_table = [1]
    table.sync(b)
    assert table.flush() == [0]
    assert table.table[0].tolist() == [1, 9, 7, -1]  # entries past its table are never read
    with pytest.raises(ValueError, match="no state slot"):
        table.sync(seq(3))
