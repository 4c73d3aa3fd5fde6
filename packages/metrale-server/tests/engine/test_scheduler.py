"""The scheduler's exact decisions on hand-built states: chunks, admissions, preemptions, slots."""

from __future__ import annotations

import itertools

import pytest

from metrale_server.engine.block_manager import BlockManager
from metrale_server.engine.scheduler import Scheduler, SchedulerConfig
from metrale_server.engine.scheduler_step import SchedulerStep
from metrale_server.engine.sequence import Sequence, SequenceStatus
from metrale_server.engine.sequence_group import SequenceGroup
from metrale_server.sampling.params import SamplingParams

# Every sequence its own id, as the engine gives them (drafts and slots are keyed by it).
SEQ_IDS = itertools.count()


def group(request_id: str, num_prompt_tokens: int, *, n: int = 1) -> SequenceGroup:
    params = SamplingParams(n=n, max_tokens=64)
    seqs = [
        Sequence(
            seq_id=next(SEQ_IDS),
            request_id=request_id,
            prompt_token_ids=tuple(range(100, 100 + num_prompt_tokens)),
            params=params,
            arrival_time=0.0,
            index=index,
        )
        for index in range(n)
    ]
    return SequenceGroup(request_id=request_id, seqs=seqs, params=params, arrival_time=0.0)


def scheduler(*, num_blocks: int, max_batch_size: int = 4, max_batch_tokens: int = 64) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens),
        BlockManager(num_blocks, 4, enable_prefix_caching=False),
    )


def decisions(step: SchedulerStep) -> list[tuple[str, int, int, int, int]]:
    """(request, seq index, start, tokens, samplers) per chunk, in step order."""
    return [
        (c.seq.request_id, c.seq.index, c.start, c.num_new_tokens, len(c.samplers))
        for c in step.chunks
    ]


def run(sched: Scheduler, step: SchedulerStep, token: int = 7) -> None:
    """Apply a step as the engine does: computed tokens, then one token per sampler."""
    sched.finish_step(step)
    for chunk in step.chunks:
        for seq in chunk.samplers:
            seq.append_token(token)


def test_prefill_is_chunked_by_the_token_budget_and_the_queue_head_waits() -> None:
    sched = scheduler(num_blocks=32, max_batch_tokens=8)
    a, b = group("a", 10), group("b", 5)
    sched.add(a)
    sched.add(b)

    first = sched.schedule()
    assert decisions(first) == [("a", 0, 0, 8, 0)]  # a partial chunk samples nothing
    assert list(sched.waiting) == [b]
    run(sched, first)

    second = sched.schedule()
    # a finishes its prompt (2 tokens, samples), then b is admitted with the 6 left.
    assert decisions(second) == [("a", 0, 8, 2, 1), ("b", 0, 0, 5, 1)]
    run(sched, second)

    third = sched.schedule()
    assert decisions(third) == [("a", 0, 10, 1, 1), ("b", 0, 5, 1, 1)]
    assert a.primary.block_table == [0, 1, 2]
    assert b.primary.block_table == [3, 4]
    assert (a.primary.slot, b.primary.slot) == (0, 1)


def test_the_latest_admitted_group_is_preempted_to_the_front_of_the_queue() -> None:
    sched = scheduler(num_blocks=4)
    a, b, c = group("a", 7), group("b", 7), group("c", 3)
    for g in (a, b, c):
        sched.add(g)

    first = sched.schedule()
    # c does not fit: 4 blocks, a and b take 2 each; the head of the queue is never skipped.
    assert decisions(first) == [("a", 0, 0, 7, 1), ("b", 0, 0, 7, 1)]
    assert list(sched.waiting) == [c]
    run(sched, first)
    second = sched.schedule()
    assert decisions(second) == [("a", 0, 7, 1, 1), ("b", 0, 7, 1, 1)]
    run(sched, second)

    third = sched.schedule()
    # a's 9th token needs a third block and none is free: b (admitted last) is preempted.
    assert decisions(third) == [("a", 0, 8, 1, 1)]
    assert third.preempted_request_ids == ("b",)
    assert list(sched.waiting) == [b, c]
    assert b.primary.status is SequenceStatus.WAITING
    assert (b.primary.block_table, b.primary.num_computed_tokens, b.primary.slot) == ([], 0, None)
    assert a.primary.block_table == [0, 1, 3]  # b's freed blocks are taken last-freed first
    assert sched.num_preemptions == 1
    run(sched, third)

    # Nothing is admitted while a still needs every block; b then recomputes prompt + output.
    fourth = sched.schedule()
    assert decisions(fourth) == [("a", 0, 9, 1, 1)]
    a.primary.status = SequenceStatus.FINISHED
    run(sched, fourth)
    assert [g.request_id for g in sched.free_finished()] == ["a"]
    fifth = sched.schedule()
    assert decisions(fifth) == [("b", 0, 0, 9, 1), ("c", 0, 0, 3, 1)]


def test_n_outputs_fork_when_the_prompt_completes_and_take_one_slot_each() -> None:
    sched = scheduler(num_blocks=16, max_batch_size=3)
    pair, single, late = group("pair", 6, n=2), group("single", 2), group("late", 2)
    for g in (pair, single, late):
        sched.add(g)

    first = sched.schedule()
    # the pair reserves 2 of the 3 slots before forking; "late" must wait for a slot.
    assert decisions(first) == [("pair", 0, 0, 6, 2), ("single", 0, 0, 2, 1)]
    assert pair.is_forked
    assert pair.seqs[1].block_table == pair.seqs[0].block_table == [0, 1]
    assert [s.slot for s in pair.seqs] == [0, 1]
    assert single.primary.slot == 2
    assert list(sched.waiting) == [late]
    run(sched, first)

    second = sched.schedule()
    # both outputs append into the shared, half-full last block: copy-on-write for one.
    assert decisions(second) == [("pair", 0, 6, 1, 1), ("pair", 1, 6, 1, 1), ("single", 0, 2, 1, 1)]
    assert second.block_copies == ((1, 3),)
    assert pair.seqs[0].block_table == [0, 3]
    assert pair.seqs[1].block_table == [0, 1]

    pair.seqs[1].status = SequenceStatus.FINISHED
    run(sched, second)
    sched.free_finished()
    third = sched.schedule()
    # the finished output gave back its blocks and slot: "late" is admitted into slot 1.
    assert decisions(third) == [("pair", 0, 7, 1, 1), ("single", 0, 3, 1, 1), ("late", 0, 0, 2, 1)]
    assert late.primary.slot == 1


def test_a_per_sequence_step_cap_chunks_every_prompt_and_cuts_drafts() -> None:
    # Sliding-window rings hold 5 tokens of a step: each sequence runs at most 5, drafts
    # included, though the step's budget has room for more.
    sched = Scheduler(
        SchedulerConfig(max_batch_size=4, max_batch_tokens=64, max_seq_step_tokens=5),
        BlockManager(32, 4, enable_prefix_caching=False),
        proposer=lambda seqs, max_tokens: [(1, 2, 3, 4, 5, 6)] * len(seqs),
    )
    a, b = group("a", 12), group("b", 3)
    sched.add(a)
    sched.add(b)
    first = sched.schedule()
    assert decisions(first) == [("a", 0, 0, 5, 0), ("b", 0, 0, 3, 1)]
    run(sched, first)
    second = sched.schedule()
    # b decodes its token and 4 of its 6 drafts.
    assert decisions(second) == [("a", 0, 5, 5, 0), ("b", 0, 3, 5, 1)]
    assert second.chunks[1].num_draft_tokens == 4


def test_a_step_cap_below_one_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="max_seq_step_tokens must be >= 1, got 0"):
        SchedulerConfig(max_batch_size=1, max_batch_tokens=8, max_seq_step_tokens=0)
