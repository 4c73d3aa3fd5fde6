"""``Sequence``: one generated continuation, its tokens and its place in the KV pool."""

from __future__ import annotations

import enum

import attrs
import torch

from metrale_model_arch import PromptPositions
from metrale_server.engine.prompt_image import PromptImage
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
    prompt so far (mean pooling's running sum, cls pooling's first state). ``images`` stand on
    the prompt's image tokens (:mod:`~metrale_server.engine.image_step`); ``rope_positions``,
    when set, place the prompt's tokens for the model's rotary embedding instead of their
    indices (:mod:`~metrale_server.engine.step_positions`).
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
    images: tuple[PromptImage, ...] = ()
    # Each image's tokens attend to each other (Gemma 3): an image is prefilled within one step.
    whole_images: bool = False
    rope_positions: PromptPositions | None = None

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

    def chunk_size(self, budget: int) -> int:
        """The tokens this sequence's next chunk takes within ``budget``: all it has left, or
        up to the image it would cut (0 when that image starts it) for a ``whole_images``
        sequence."""
        size = min(self.num_uncomputed_tokens, budget)
        return size if not self.whole_images else self.whole_image_prefix(size)

    def whole_image_prefix(self, size: int) -> int:
        """``size`` tokens from the first uncomputed one, cut back before the marker of an
        image they would cut."""
        start = self.num_computed_tokens
        cut = self.image_cut_at(start + size)
        return size if cut is None else max(cut.offset - 1 - start, 0)

    def image_cut_at(self, position: int) -> PromptImage | None:
        """The image a step edge at ``position`` would cut, if any: a whole image is prefilled
        in one step with the tokens on either side of it (its begin and end markers), so the
        model can tell an image its rows hold entirely from one the step's edge cuts."""
        return next((p for p in self.images if p.offset <= position <= p.end), None)

    def block_key(self, start: int, stop: int) -> tuple[int | str, ...]:
        """What names tokens ``start .. stop`` in the prefix cache: their ids, then the digest
        of every image they reach (image tokens share one id; the image tells them apart)."""
        key: tuple[int | str, ...] = tuple(self.token_ids[start:stop])
        digests = tuple(p.digest for p in self.images if p.offset < stop and start < p.end)
        return key + digests if digests else key

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
