"""A step's rotary positions when a sequence in it has M-RoPE prompt positions.

Such a sequence's prompt tokens take their stored ``(3,)`` positions (fixed when the request
was made), its later tokens (outputs, drafts) their index plus the prompt's delta in all three
rows; every other sequence's tokens take their index in all three rows. The KV slots keep
following the indices: only the rotary embedding reads these.
"""

from __future__ import annotations

import torch

from metrale_server.engine.scheduler_step import SchedulerStep


def rope_step_positions(step: SchedulerStep, indices: torch.Tensor) -> torch.Tensor | None:
    """``(3, tokens)`` int64 for a step whose tokens sit at ``indices (tokens,)`` (on the
    host, in step order), or ``None`` when no sequence in it has prompt positions (the
    indices are the positions). O(tokens in the step)."""
    if all(chunk.seq.rope_positions is None for chunk in step.chunks):
        return None
    positions = indices.repeat(3, 1)
    flat = 0
    for chunk in step.chunks:
        rope, start, num_tokens = chunk.seq.rope_positions, chunk.start, chunk.num_new_tokens
        if rope is not None:
            num_prompt = max(0, min(start + num_tokens, rope.num_tokens) - start)
            positions[:, flat : flat + num_prompt] = rope.positions[:, start : start + num_prompt]
            positions[:, flat + num_prompt : flat + num_tokens] += rope.delta
        flat += num_tokens
    return positions
