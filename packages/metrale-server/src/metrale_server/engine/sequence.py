"""``Sequence``: one generated continuation, its tokens and its place in the KV pool."""

from __future__ import annotations

import enum

import attrs
import torch

from metrale_server.output.outputs import TokenLogprob
from metrale_server.sampling.params import SamplingParams
from metrale_server.sampling.penalty_state import PenaltyState
from metrale_server.structured import GrammarMatcher


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@attrs.define(eq=False, repr=False)
class Sequence:
    """Mutable state of one sequence. ``n > 1`` requests have one per output.

    ``token_ids`` is prompt then output. The first ``num_computed_tokens`` tokens have their
    K/V in the pool (in the blocks of ``block_table``); the rest still have to run through the
    model. ``num_cached_tokens`` of the prompt came from the prefix cache at admission.
    ``index`` is the output's place among its request's ``n``. While it holds blocks the
    sequence also holds a state slot (``slot``; ``slot_ticket`` is new at every assignment, so
    whoever keeps per-slot state knows when to reset it). ``generator`` is the seeded
    request's own; ``penalty`` is built on first use and then updated one token at a time.
    ``grammar`` (structured outputs) has accepted every output token so far.
    ``draft_token_ids`` are speculative tokens proposed for the coming step (not yet part of
    ``token_ids``: the step checks them, and only those kept are appended).
    ``prompt_logprobs`` holds those of prompt tokens ``1..len(prompt_logprobs)`` computed so far
    (``SamplingParams.prompt_logprobs``); ``pool_state`` what a pooling request has read of its
    prompt so far (mean pooling's running sum, cls pooling's first state).
    """

    seq_id: int
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    arrival_time: float
    index: int = 0
    generator: torch.Generator | None = None
    token_ids: list[int] = attrs.field(init=False)
    block_table: list[int] = attrs.field(factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    num_preemptions: int = 0
    slot: int | None = None
    slot_ticket: int = 0
    penalty: PenaltyState | None = None
    grammar: GrammarMatcher | None = None
    draft_token_ids: tuple[int, ...] = ()
    prompt_logprobs: list[TokenLogprob] = attrs.field(factory=list)
    pool_state: torch.Tensor | None = None

    def __attrs_post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def reads_whole_prompt(self) -> bool:
        """Whether every prompt position must run through the model (prompt logprobs, mean or
        cls pooling): such a sequence takes no prefix-cache hit."""
        pooling = self.params.pooling
        return self.params.prompt_logprobs is not None or (
            pooling is not None and pooling.reads_every_position
        )

    @property
    def has_all_prompt_logprobs(self) -> bool:
        return len(self.prompt_logprobs) >= self.num_prompt_tokens - 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        if self.penalty is not None:
            self.penalty.add_output_token(token_id)

    def __repr__(self) -> str:
        # Never prints token ids: a prompt must not reach a log through a repr.
        return (
            f"Sequence(id={self.seq_id}, request={self.request_id!r}, status={self.status.value}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
            f"blocks={len(self.block_table)})"
        )
