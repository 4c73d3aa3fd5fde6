"""Log-probabilities of sampled tokens and their top alternatives."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch


@attrs.frozen(kw_only=True)
class TokenLogprobs:
    """One sampled token's log-probability and the row's ``logprobs`` most likely tokens.

    ``top_token_ids`` / ``top_logprobs`` are in descending log-probability order and hold
    exactly ``SamplingParams.logprobs`` entries (none for ``logprobs=0``). Values come from the
    processed logits (after logit_bias, min_tokens and penalties, before temperature and the
    top-k/top-p/min-p filters), so a token the model may not sample can still be listed, and a
    suppressed token reads ``-inf``.
    """

    logprob: float
    top_token_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


@attrs.frozen(kw_only=True, eq=False, repr=False)
class LogprobTensors:
    """Device-side logprobs of the rows that asked, in ``SamplingBatch.logprob_row_indices``
    order; the top tensors are ``max_num_logprobs`` wide."""

    chosen_logprobs: torch.Tensor  # (logprob_rows,) float32
    top_token_ids: torch.Tensor  # (logprob_rows, max_num_logprobs) int64
    top_logprobs: torch.Tensor  # (logprob_rows, max_num_logprobs) float32


def compute_logprob_tensors(
    row_logprobs: torch.Tensor, chosen_token_ids: torch.Tensor, max_num_logprobs: int
) -> LogprobTensors:
    """``row_logprobs`` (rows, vocab) log-softmax values; ``chosen_token_ids`` (rows,)."""
    chosen_logprobs = row_logprobs.gather(1, chosen_token_ids[:, None])[:, 0]
    top_logprobs, top_token_ids = row_logprobs.topk(max_num_logprobs, dim=-1)
    return LogprobTensors(
        chosen_logprobs=chosen_logprobs, top_token_ids=top_token_ids, top_logprobs=top_logprobs
    )


def unpack_logprobs(
    num_logprobs: Sequence[int | None],
    chosen_logprobs: Sequence[float],
    top_token_ids: Sequence[Sequence[float]],
    top_logprobs: Sequence[Sequence[float]],
) -> tuple[TokenLogprobs | None, ...]:
    """Host lists (asking rows only, ids still as floats) → one entry per batch row."""
    results: list[TokenLogprobs | None] = []
    asking_row = 0
    for count in num_logprobs:
        if count is None:
            results.append(None)
            continue
        results.append(
            TokenLogprobs(
                logprob=chosen_logprobs[asking_row],
                top_token_ids=tuple(
                    int(token_id) for token_id in top_token_ids[asking_row][:count]
                ),
                top_logprobs=tuple(top_logprobs[asking_row][:count]),
            )
        )
        asking_row += 1
    return tuple(results)
