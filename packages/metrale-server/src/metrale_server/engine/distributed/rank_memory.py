"""One rank's memory: what its plan allots each owner and what its ledger holds."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class RankMemory:
    rank: int
    planned_by_owner: dict[str, int]
    ledger_by_owner: dict[str, int]

    def to_json(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "planned_by_owner": dict(self.planned_by_owner),
            "ledger_by_owner": dict(self.ledger_by_owner),
        }
