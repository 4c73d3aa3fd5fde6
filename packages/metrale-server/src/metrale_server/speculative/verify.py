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

from metrale_server.sampling.params import SamplingParams


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(positions, vocab) probabilities after temperature, top-k, top-p and min-p."""
    rows = logits.float() / params.temperature
    vocab_size = rows.shape[1]
    if 0 < params.top_k < vocab_size:
        threshold = rows.topk(params.top_k, dim=-1).values[:, -1:]
        rows = rows.masked_fill(rows < threshold, float("-inf"))
    probs = rows.softmax(dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
    if params.min_p > 0.0:
        floor = params.min_p * probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < floor, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


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
