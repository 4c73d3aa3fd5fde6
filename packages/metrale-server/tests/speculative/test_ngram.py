"""The n-gram proposer: the continuation of the latest earlier match of the longest suffix."""

from __future__ import annotations

from metrale_server.speculative import propose_ngram


def test_the_longest_suffix_that_occurred_before_wins() -> None:
    tokens = [1, 2, 3, 9, 2, 3, 4, 5, 1, 2, 3]
    # "1 2 3" occurred at the start, followed by 9; "2 3" alone would give 4 (its latest match).
    assert propose_ngram(tokens, num_tokens=3, min_n=1, max_n=3) == (9, 2, 3)
    assert propose_ngram(tokens, num_tokens=3, min_n=1, max_n=2) == (4, 5, 1)


def test_drafts_stop_at_the_end_and_at_num_tokens() -> None:
    assert propose_ngram([5, 6, 7, 5], num_tokens=8, min_n=1, max_n=2) == (6, 7, 5)
    assert propose_ngram([5, 6, 7, 5], num_tokens=1, min_n=1, max_n=2) == (6,)
    assert propose_ngram([5, 6, 7, 5], num_tokens=0, min_n=1, max_n=2) == ()


def test_nothing_without_a_match() -> None:
    assert propose_ngram([1, 2, 3, 4], num_tokens=4, min_n=1, max_n=3) == ()
    assert propose_ngram([7, 1, 7], num_tokens=2, min_n=2, max_n=3) == ()
    assert propose_ngram([7], num_tokens=2, min_n=1, max_n=3) == ()
