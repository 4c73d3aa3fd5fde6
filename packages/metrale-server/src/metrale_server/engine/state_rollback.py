"""Speculation over per-sequence state: snapshot before the verify step, replay after it.

A verify step runs a sequence's drafts through every layer. K/V rows of rejected drafts are
harmless (never read, rewritten later), but a linear-attention layer's recurrent and conv
state, and the DSA indexer's pool still filling, have then folded in tokens that are not the
sequence's. So before the step each speculating sequence's state is checkpointed
(:class:`~metrale_model_arch.state_checkpoints.StateCheckpoints`, priced in the plan as
``spec_state_snapshot``); after verification a sequence that kept every draft keeps its state,
and any other gets its checkpoint back and is rewound to the step's first position: its next
step runs the tokens it kept again with the token it sampled, which makes its state plain
decoding's after those tokens. The replay rides in the next step's forward rather than costing
one of its own; that step drafts nothing for the sequence (a rewound sequence has more than
one token to run, ``Scheduler._propose``), so a rejection never makes a replay longer than the
drafts kept plus two tokens.
"""

from __future__ import annotations

from metrale_model_arch import LoadedModel
from metrale_model_arch.memory import MemoryPlan
from metrale_model_arch.state_checkpoints import (
    SlotPosition,
    StateCheckpoints,
    allocate_state_checkpoints,
)
from metrale_server.args import EngineArgs
from metrale_server.engine.model_runner import ModelRunner
from metrale_server.engine.scheduler import Scheduler
from metrale_server.engine.scheduler_step import ScheduledChunk, SchedulerStep
from metrale_server.memory.ledger import MemoryLedger


def build_state_rollback(
    args: EngineArgs,
    loaded: LoadedModel,
    plan: MemoryPlan,
    ledger: MemoryLedger,
    runner: ModelRunner,
) -> StateRollback | None:
    """The rollback of a speculating engine over a model with such state, its checkpoints
    allocated through ``ledger`` as the plan priced them; ``None`` without speculation or
    without state to roll back. Raises ``ValueError`` naming the flag for a split model (the
    other ranks' state would not be rolled back)."""
    if args.speculative_config is None:
        return None
    checkpoints = allocate_state_checkpoints(
        loaded.rank_config,
        seq_states=runner.seq_states,
        kv_caches=runner.kv_caches,
        num_slots=plan.max_batch_size,
        block_size=plan.inputs.block_size,
        indexer_paged=plan.inputs.indexer_paged,
        allocator=ledger.allocate,
    )
    if checkpoints.is_empty:
        return None
    if args.tensor_parallel_size > 1:
        raise ValueError(
            "--speculative-config with --tensor-parallel-size > 1: rolling back "
            f"{loaded.config.model_type}'s per-sequence state on every rank is not built yet"
        )
    return StateRollback(checkpoints)


class StateRollback:
    def __init__(self, checkpoints: StateCheckpoints) -> None:
        self.checkpoints = checkpoints
        self.num_rollbacks = 0

    def save(self, step: SchedulerStep) -> None:
        """Checkpoint every sequence that runs drafts in ``step`` (before it runs)."""
        self.checkpoints.save([_position(chunk) for chunk in _speculating(step)])

    def roll_back(self, step: SchedulerStep, scheduler: Scheduler) -> None:
        """After ``step`` ran and its drafts were verified: each sequence still running that
        did not keep all its drafts gets its checkpoint back and recomputes from there."""
        rejected = [
            chunk
            for chunk in _speculating(step)
            if chunk.seq.slot is not None
            and not chunk.seq.is_finished
            and chunk.seq.num_computed_tokens < chunk.start + chunk.num_new_tokens
        ]
        self.checkpoints.restore([_position(chunk) for chunk in rejected])
        for chunk in rejected:
            scheduler.rewind(chunk.seq, chunk.start)
        self.num_rollbacks += len(rejected)


def _speculating(step: SchedulerStep) -> list[ScheduledChunk]:
    return [chunk for chunk in step.chunks if chunk.num_draft_tokens]


def _position(chunk: ScheduledChunk) -> SlotPosition:
    seq = chunk.seq
    assert seq.slot is not None
    return SlotPosition(
        slot=seq.slot,
        start=chunk.start,
        block_table=seq.block_table,
    )
