"""``PersistentBlockTable``: every running sequence's block table, one row per state slot."""

from __future__ import annotations

import torch

from metrale_server.engine.sequence import Sequence


class PersistentBlockTable:
    """A ``(slots, max_blocks_per_seq)`` int64 tensor (an arena buffer) kept in step with the
    block manager's tables.

    ``sync`` is called for each sequence of a step and returns its row; it queues only the
    entries the sequence gained since its last sync, plus its previous last entry (a
    copy-on-write may have replaced it), so the work per step does not grow with a sequence's
    length. A new ``slot_ticket`` (a slot that changed hands) rewrites the row from scratch,
    and the row is listed by ``flush`` so per-slot state can be reset. ``flush`` writes what was
    queued, in one indexed store.
    """

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        num_rows = table.shape[0]
        self._tickets = [0] * num_rows
        self._num_written = [0] * num_rows
        self._rows: list[int] = []
        self._columns: list[int] = []
        self._values: list[int] = []
        self._new_rows: list[int] = []

    def sync(self, seq: Sequence) -> int:
        row = seq.slot
        if row is None:
            raise ValueError(f"{seq} has no state slot")
        if self._tickets[row] != seq.slot_ticket:
            self._tickets[row] = seq.slot_ticket
            self._num_written[row] = 0
            self._new_rows.append(row)
        table = seq.block_table
        start = max(self._num_written[row] - 1, 0)
        end = len(table)
        if end > start:
            self._rows += [row] * (end - start)
            self._columns += range(start, end)
            self._values += table[start:end]
        self._num_written[row] = end
        return row

    def flush(self) -> list[int]:
        """Write the queued entries; return the rows that changed hands since the last flush."""
        new_rows, self._new_rows = self._new_rows, []
        if not self._rows:
            return new_rows
        device = self.table.device
        index = (
            torch.tensor(self._rows, dtype=torch.int64, device=device),
            torch.tensor(self._columns, dtype=torch.int64, device=device),
        )
        self.table.index_put_(index, torch.tensor(self._values, dtype=torch.int64, device=device))
        self._rows, self._columns, self._values = [], [], []
        return new_rows
