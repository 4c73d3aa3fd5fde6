"""A step's M-RoPE positions: a sequence's prompt tokens at their stored positions, its later
tokens at their index plus the delta, other sequences' tokens at their index in all rows."""

from __future__ import annotations

import torch

from metrale_model_arch import PromptPositions
from metrale_server.engine.scheduler_step import ScheduledChunk, SchedulerStep
from metrale_server.engine.sequence import Sequence
from metrale_server.engine.step_positions import rope_step_positions
from metrale_server.sampling.params import SamplingParams

# Text, a 2x2 image (tokens 2..5 at 2 + (row, column)), text again at 2 + max(2, 2) = 4.
PROMPT = PromptPositions(
    positions=torch.tensor([[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]]),
    delta=-2,
)


def sequence(seq_id: int, num_tokens: int, rope: PromptPositions | None) -> Sequence:
    return Sequence(
        seq_id=seq_id,
        request_id=str(seq_id),
        prompt_token_ids=tuple(range(num_tokens)),
        params=SamplingParams(max_tokens=8),
        arrival_time=0.0,
        rope_positions=rope,
    )


def chunk(seq: Sequence, start: int, num_new_tokens: int) -> ScheduledChunk:
    return ScheduledChunk(seq=seq, start=start, num_new_tokens=num_new_tokens, samplers=())


def indices(step: SchedulerStep) -> torch.Tensor:
    return torch.cat([torch.arange(c.start, c.start + c.num_new_tokens) for c in step.chunks])


def test_prompt_tokens_take_their_stored_positions_and_later_ones_the_delta() -> None:
    text, image = sequence(0, 12, None), sequence(1, 7, PROMPT)
    image.token_ids += [50, 51]
    # A text decode, then the image sequence recomputed from inside its image (after a
    # preemption): its last three prompt tokens and both outputs.
    step = SchedulerStep(chunks=(chunk(text, 11, 1), chunk(image, 4, 5)))
    positions = rope_step_positions(step, indices(step))
    assert positions is not None
    assert positions.tolist() == [
        [11, 2, 2, 4, 5, 6],
        [11, 3, 3, 4, 5, 6],
        [11, 2, 3, 4, 5, 6],
    ]


def test_a_step_without_prompt_positions_keeps_its_indices() -> None:
    step = SchedulerStep(chunks=(chunk(sequence(0, 9, None), 3, 4),))
    assert rope_step_positions(step, indices(step)) is None
