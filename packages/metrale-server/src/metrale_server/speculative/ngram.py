"""Prompt lookup: draft tokens copied from where the sequence's ending appeared before."""

from __future__ import annotations

from collections.abc import Sequence


def propose_ngram(
    token_ids: Sequence[int], *, num_tokens: int, min_n: int, max_n: int
) -> tuple[int, ...]:
    """Up to ``num_tokens`` tokens that followed the most recent earlier occurrence of the last
    ``n`` tokens, for the longest ``n`` in ``max_n .. min_n`` that occurs; ``()`` if none."""
    length = len(token_ids)
    if num_tokens < 1:
        return ()
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = list(token_ids[length - n :])
        # Latest match first: its continuation is the likeliest to repeat.
        for start in range(length - n - 1, -1, -1):
            if token_ids[start] == suffix[0] and list(token_ids[start : start + n]) == suffix:
                follow = start + n
                return tuple(token_ids[follow : min(follow + num_tokens, length)])
    return ()
