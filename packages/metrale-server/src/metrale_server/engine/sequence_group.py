"""``SequenceGroup``: one request's sequences (``n`` of them), scheduled and preempted together."""

from __future__ import annotations

import attrs

from metrale_server.engine.sequence import Sequence, SequenceStatus
from metrale_server.sampling.params import SamplingParams


@attrs.define(eq=False, repr=False)
class SequenceGroup:
    """The ``n`` sequences of a request.

    Only ``seqs[0]`` runs the prompt; the others are forked from it (sharing its blocks) when
    the prompt's last chunk is scheduled, so all ``n`` first tokens come from one forward pass.
    After a preemption every unfinished sequence recomputes on its own.
    ``has_sent_prompt_logprobs`` once the request's output carried them.
    """

    request_id: str
    seqs: list[Sequence]
    params: SamplingParams
    arrival_time: float
    is_forked: bool = False
    has_sent_prompt_logprobs: bool = False

    @property
    def primary(self) -> Sequence:
        return self.seqs[0]

    def unfinished_seqs(self) -> list[Sequence]:
        if not self.is_forked:
            return [self.primary] if not self.primary.is_finished else []
        return [seq for seq in self.seqs if not seq.is_finished]

    @property
    def num_slots(self) -> int:
        """Batch slots the group takes: one per unfinished output once forked, else ``n``."""
        return len(self.unfinished_seqs()) if self.is_forked else len(self.seqs)

    @property
    def is_finished(self) -> bool:
        return all(seq.status is SequenceStatus.FINISHED for seq in self.seqs)

    def __repr__(self) -> str:
        return f"SequenceGroup(request={self.request_id!r}, n={len(self.seqs)})"
