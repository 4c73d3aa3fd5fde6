"""The scheduler: which sequences run in the next step, and how many of their tokens."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import attrs

from metrale_server.engine.block_manager import BlockManager
from metrale_server.engine.scheduler_step import ScheduledChunk, SchedulerStep
from metrale_server.engine.sequence import Sequence, SequenceStatus
from metrale_server.engine.sequence_group import SequenceGroup
from metrale_server.engine.state_slots import StateSlots


@attrs.frozen(kw_only=True)
class SchedulerConfig:
    """``max_batch_size`` running sequences at most; ``max_batch_tokens`` tokens per step;
    ``max_seq_step_tokens``, when set, tokens per sequence per step (drafts included: a model
    whose sliding-window rings hold one step's tokens)."""

    max_batch_size: int
    max_batch_tokens: int
    max_seq_step_tokens: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        if self.max_seq_step_tokens is not None and self.max_seq_step_tokens < 1:
            raise ValueError(f"max_seq_step_tokens must be >= 1, got {self.max_seq_step_tokens}")

    def seq_budget(self, budget: int) -> int:
        """What one sequence may take of the step's remaining ``budget``."""
        if self.max_seq_step_tokens is None:
            return budget
        return min(budget, self.max_seq_step_tokens)


class Scheduler:
    """First come, first served over a waiting queue and a running list.

    Contract of ``schedule``: running groups go first, in admission order, each unfinished
    sequence getting its next chunk (1 token when decoding, up to the remaining token budget
    when prefilling); then waiting groups are admitted in arrival order while the batch has
    slots, the budget has tokens and the pool has blocks (the queue head is never skipped).
    When a running sequence cannot get its slots, the most recently admitted group is
    preempted (all its blocks freed, its tokens recomputed later) and goes back to the front
    of the queue. The caller applies the step's results with ``finish_step``. A sequence holds
    a state slot exactly while it holds blocks.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        slots: StateSlots | None = None,
        *,
        proposer: Callable[[list[Sequence], int], list[tuple[int, ...]]] | None = None,
        on_release: Callable[[Sequence], None] | None = None,
    ) -> None:
        """``proposer(seqs, max_tokens)`` (speculative decoding) drafts up to ``max_tokens``
        tokens for each sequence about to decode one token; the step then runs them too.
        ``on_release(seq)`` is told of each sequence about to give back its blocks and slot."""
        self.proposer = proposer
        self.on_release = on_release
        self.config = config
        self.block_manager = block_manager
        self.slots = StateSlots(config.max_batch_size) if slots is None else slots
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.num_preemptions = 0

    @property
    def num_running_seqs(self) -> int:
        return sum(group.num_slots for group in self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, group: SequenceGroup) -> None:
        self.waiting.append(group)

    def abort(self, request_id: str) -> SequenceGroup | None:
        """Remove the request wherever it is and free its blocks; ``None`` if unknown."""
        for queue in (self.running, self.waiting):
            for group in queue:
                if group.request_id == request_id:
                    queue.remove(group)
                    for seq in group.seqs:
                        self._free(seq)
                        seq.status = SequenceStatus.FINISHED
                    return group
        return None

    def schedule(self) -> SchedulerStep:
        budget = self.config.max_batch_tokens
        drafts = self._propose(budget)
        chunks: list[ScheduledChunk] = []
        copies: list[tuple[int, int]] = []
        preempted: list[str] = []

        index = 0
        while index < len(self.running) and budget > 0:
            group = self.running[index]
            group_chunks: list[ScheduledChunk] = []
            group_copies: list[tuple[int, int]] = []
            is_preempted = False
            for seq in group.unfinished_seqs():
                seq_budget = self.config.seq_budget(budget)
                num_new = seq.chunk_size(seq_budget)
                if num_new == 0:
                    break
                seq.draft_token_ids = drafts.get(seq.seq_id, ())[: seq_budget - 1]
                num_new += len(seq.draft_token_ids)
                while not self.block_manager.can_append_slots(seq, num_new):
                    if seq.draft_token_ids:  # drafts are the first thing to give up
                        num_new -= len(seq.draft_token_ids)
                        seq.draft_token_ids = ()
                        continue
                    victim = self.running[-1]
                    self._preempt(victim)
                    preempted.append(victim.request_id)
                    if victim is group:
                        is_preempted = True
                        break
                if is_preempted:
                    break
                group_copies += self.block_manager.append_slots(seq, num_new)
                group_chunks.append(self._chunk(group, seq, num_new))
                budget -= num_new
            if is_preempted:
                budget += sum(chunk.num_new_tokens for chunk in group_chunks)
            else:
                chunks += group_chunks
                copies += group_copies
                index += 1

        # NOTE: nothing is admitted in a step that preempted: the freed blocks would go straight
        # back to the queue head and the step would thrash.
        while self.waiting and budget > 0 and not preempted:
            group = self.waiting[0]
            if self.num_running_seqs + group.num_slots > self.config.max_batch_size:
                break
            if not self._allocate(group):
                break
            self.waiting.popleft()
            self.running.append(group)
            for seq in group.unfinished_seqs():
                seq.status = SequenceStatus.RUNNING
                num_new = seq.chunk_size(self.config.seq_budget(budget))
                if num_new == 0:
                    continue
                copies += self.block_manager.append_slots(seq, num_new)
                chunks.append(self._chunk(group, seq, num_new))
                budget -= num_new

        return SchedulerStep(
            chunks=tuple(chunks),
            block_copies=tuple(copies),
            preempted_request_ids=tuple(preempted),
        )

    def finish_step(self, step: SchedulerStep) -> None:
        """Record that the step's chunks ran: their K/V is now in the pool."""
        for chunk in step.chunks:
            # Drafts count once the engine knows which were kept (``accept_drafts``).
            chunk.seq.num_computed_tokens = (
                chunk.start + chunk.num_new_tokens - chunk.num_draft_tokens
            )
            self.block_manager.commit_computed(chunk.seq)
            for sibling in chunk.samplers[1:]:
                sibling.num_computed_tokens = chunk.seq.num_computed_tokens

    def free_finished(self) -> list[SequenceGroup]:
        """Free the blocks of finished sequences; drop and return the groups now finished."""
        done: list[SequenceGroup] = []
        for group in list(self.running):
            for seq in group.seqs:
                if seq.is_finished and (seq.block_table or seq.slot is not None):
                    self._free(seq)
            if group.is_finished:
                self.running.remove(group)
                done.append(group)
        return done

    def accept_drafts(self, seq: Sequence, num_accepted: int) -> None:
        """After a step with drafts: ``num_accepted`` of them are now ``seq``'s tokens, and
        their K/V (written by that step) counts as computed."""
        seq.num_computed_tokens += num_accepted
        seq.draft_token_ids = ()
        self.block_manager.commit_computed(seq)

    def rewind(self, seq: Sequence, num_computed_tokens: int) -> None:
        """``seq``'s state went back to its first ``num_computed_tokens`` tokens (speculation
        rolled it back): its next steps compute the rest again, in the blocks it holds."""
        seq.num_computed_tokens = min(seq.num_computed_tokens, num_computed_tokens)

    def _propose(self, budget: int) -> dict[int, tuple[int, ...]]:
        """Drafts, by sequence id, for the running sequences about to decode one token (not
        one rewound: its next step runs its kept tokens again, without drafts)."""
        if self.proposer is None or budget < 2:
            return {}
        decoding = [
            seq
            for group in self.running
            for seq in group.unfinished_seqs()
            if seq.num_uncomputed_tokens == 1
        ]
        if not decoding:
            return {}
        proposed = self.proposer(decoding, budget - 1)
        return {seq.seq_id: drafts for seq, drafts in zip(decoding, proposed, strict=True)}

    def _chunk(self, group: SequenceGroup, seq: Sequence, num_new: int) -> ScheduledChunk:
        start = seq.num_computed_tokens
        num_drafts = len(seq.draft_token_ids)
        reaches_end = start + num_new - num_drafts == seq.num_tokens
        samplers: tuple[Sequence, ...] = ()
        if reaches_end:
            samplers = (seq,)
            if not group.is_forked and len(group.seqs) > 1:
                for sibling in group.seqs[1:]:
                    self.block_manager.fork(seq, sibling)
                    self.slots.assign(sibling)
                    sibling.status = SequenceStatus.RUNNING
                group.is_forked = True
                samplers = tuple(group.seqs)
        return ScheduledChunk(
            seq=seq,
            start=start,
            num_new_tokens=num_new,
            samplers=samplers,
            num_draft_tokens=num_drafts,
        )

    def _allocate(self, group: SequenceGroup) -> bool:
        """Blocks for every unfinished sequence of ``group``, all or nothing."""
        allocated: list[Sequence] = []
        for seq in group.unfinished_seqs():
            if not self.block_manager.can_allocate(seq):
                for done in allocated:
                    self._free(done)
                    done.num_computed_tokens = done.num_cached_tokens = 0
                return False
            self.block_manager.allocate(seq)
            self.slots.assign(seq)
            allocated.append(seq)
        return True

    def _preempt(self, group: SequenceGroup) -> None:
        self.running.remove(group)
        for seq in group.unfinished_seqs():
            self._free(seq)
            seq.num_computed_tokens = 0
            seq.num_cached_tokens = 0
            seq.draft_token_ids = ()
            seq.status = SequenceStatus.WAITING
            seq.num_preemptions += 1
        self.waiting.appendleft(group)
        self.num_preemptions += 1

    def _free(self, seq: Sequence) -> None:
        if self.on_release is not None:
            self.on_release(seq)
        self.block_manager.free(seq)
        self.slots.release(seq)
