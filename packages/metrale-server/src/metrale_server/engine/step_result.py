"""What one step of the model runner returns: sampled tokens (and pooling vectors), prompt
logprobs, and the pooling states of prompts not done yet."""

from __future__ import annotations

import attrs
import torch

from metrale_server.engine.sequence import Sequence
from metrale_server.output.outputs import TokenLogprob


@attrs.frozen(kw_only=True, slots=True)
class SampledToken:
    """A token sampled for ``seq``; ``fault`` (and no token) when sampling it raised: that
    sequence's request fails, the others in the step go on."""

    seq: Sequence
    token_id: int
    logprob: TokenLogprob | None = None
    fault: str | None = None
    # A pooling sequence's vector (its embedding, or its one score): no token then.
    pooled: tuple[float, ...] | None = None


@attrs.frozen(kw_only=True)
class PromptLogprobs:
    """Logprobs of ``seq``'s prompt tokens ``first_position + 1 ..``, computed in a step."""

    seq: Sequence
    first_position: int
    entries: tuple[TokenLogprob, ...]


@attrs.frozen(kw_only=True)
class StepResult:
    """A step's news: sampled tokens (and finished pooling vectors), prompt logprobs, the
    state of each embedding whose prompt is not done yet, and, for a runner that keeps them
    (MTP speculation reads them), the target's final hidden state of every token in the step,
    in step order."""

    tokens: list[SampledToken]
    prompt_logprobs: list[PromptLogprobs] = attrs.field(factory=list)
    pool_states: list[tuple[Sequence, torch.Tensor]] = attrs.field(factory=list)
    hidden: torch.Tensor | None = None
