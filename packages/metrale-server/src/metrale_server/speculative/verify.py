"""Checking draft tokens against the target model's distributions at their positions.

Greedy: the drafts are kept up to the first one that is not the argmax there, then the argmax
is added, so the output is the one plain greedy decoding makes. Sampled: rejection sampling
for a one-hot draft (the n-gram proposer's): draft ``d`` at a position whose target
distribution is ``p`` is kept with probability ``p(d)``; otherwise the token there is drawn
from ``p`` with ``d`` removed, renormalized, and the rest is dropped. When all are kept, one
more token is drawn from the last position's ``p``. Each emitted token then has exactly the
target's distribution given the tokens before it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from metrale_server.sampling.sampler import target_probs

__all__ = ["target_probs", "verify_greedy", "verify_sampled"]


def verify_greedy(logits: torch.Tensor, drafts: Sequence[int]) -> list[int]:
    """The emitted tokens for ``drafts`` at ``logits`` rows 0..k (row j predicts position j)."""
    best = logits.argmax(dim=-1).tolist()
    emitted: list[int] = []
    for position, draft in enumerate(drafts):
        if best[position] != draft:
            break
        emitted.append(draft)
    emitted.append(best[len(emitted)])
    return emitted


def verify_sampled(
    probs: torch.Tensor, drafts: Sequence[int], generator: torch.Generator | None
) -> list[int]:
    """Rejection sampling of one-hot ``drafts`` against ``probs`` rows 0..k."""
    uniforms = torch.rand(len(drafts), generator=generator, device=probs.device).tolist()
    emitted: list[int] = []
    for position, draft in enumerate(drafts):
        if uniforms[position] < float(probs[position, draft]):
            emitted.append(draft)
            continue
        residual = probs[position].clone()
        residual[draft] = 0.0
        emitted.append(_draw(residual, generator))
        return emitted
    emitted.append(_draw(probs[len(drafts)], generator))
    return emitted


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(weights, 1, generator=generator))
