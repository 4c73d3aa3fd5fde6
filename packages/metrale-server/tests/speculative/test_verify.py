"""Draft verification. Greedy keeps exactly the argmax path; rejection sampling keeps the
target distribution, checked by chi-square tests on a 6-token vocabulary: with one draft, and
with 3 and 4 drafts whose target distribution differs at every position (so a verifier that
reads another position's row emits the wrong tokens)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from metrale_server.sampling.params import SamplingParams
from metrale_server.speculative import target_probs, verify_greedy, verify_sampled

# Chi-square critical values at significance 0.001 (df = 5 and df = 4).
CHI2_0001 = {5: 20.515, 4: 18.467}
NUM_DRAWS = 20000


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    kept = expected > 0
    return float((((counts - expected) ** 2)[kept] / expected[kept]).sum())


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P(a chi-square at least this large) for ``counts`` drawn from ``probs``, over the tokens
    ``probs`` gives mass (a count on any other token fails the caller's own check)."""
    kept = probs > 0
    statistic = chi_square(counts[kept], probs[kept] / probs[kept].sum())
    degrees = int(kept.sum()) - 1
    if degrees == 0:  # one possible token: the counts cannot be off
        return 1.0
    half = torch.tensor(degrees / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(half, torch.tensor(statistic / 2, dtype=torch.float64)))


def test_greedy_keeps_drafts_up_to_the_first_miss_then_adds_the_argmax() -> None:
    logits = torch.full((4, 6), -5.0)
    for position, best in enumerate([2, 3, 1, 5]):
        logits[position, best] = 5.0
    assert verify_greedy(logits, [2, 3, 4]) == [2, 3, 1]
    assert verify_greedy(logits, [2, 3, 1]) == [2, 3, 1, 5]
    assert verify_greedy(logits, [0, 3, 1]) == [2]


def test_rejection_sampling_keeps_the_target_distribution() -> None:
    generator = torch.Generator().manual_seed(1234)
    probs = torch.tensor(
        [[0.05, 0.40, 0.15, 0.10, 0.20, 0.10], [0.30, 0.05, 0.05, 0.25, 0.15, 0.20]]
    )
    first = torch.zeros(6)
    second_after_draft = torch.zeros(6)
    for _ in range(NUM_DRAWS):
        emitted = verify_sampled(probs, [1], generator)  # draft token 1 at position 0
        first[emitted[0]] += 1
        if emitted[0] == 1:
            assert len(emitted) == 2
            second_after_draft[emitted[1]] += 1
    # The first token is distributed as probs[0] whatever the draft was...
    assert chi_square(first, probs[0]) < CHI2_0001[5]
    # ...and after a kept draft, the bonus token as probs[1].
    assert chi_square(second_after_draft, probs[1]) < CHI2_0001[5]


def test_a_draft_the_target_never_takes_is_always_replaced() -> None:
    generator = torch.Generator().manual_seed(7)
    probs = torch.tensor([[0.0, 0.2, 0.2, 0.2, 0.2, 0.2], [1.0, 0, 0, 0, 0, 0]])
    counts = torch.zeros(6)
    for _ in range(5000):
        [token] = verify_sampled(probs, [0], generator)
        counts[token] += 1
    assert counts[0] == 0
    assert chi_square(counts[1:], probs[0, 1:]) < CHI2_0001[4]


def test_target_probs_apply_the_request_filters() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    top_k = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert top_k[0, 2:].sum() == 0
    assert torch.allclose(top_k[0, :2], torch.softmax(logits[0, :2], dim=0))
    top_p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert (top_p[0] > 0).tolist() == [True, True, False, False, False]
    hot = target_probs(logits, SamplingParams(temperature=2.0))
    assert torch.allclose(hot[0], torch.softmax(logits[0] / 2, dim=0))


def test_target_probs_make_every_tensor_on_the_logits_device() -> None:
    """Run with torch's default device ``meta``: a filter tensor made without naming its
    device would meet the CPU logits and raise, as on a GPU it would meet CUDA ones."""
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    params = SamplingParams(temperature=0.8, top_k=4, top_p=0.7, min_p=0.05)
    expected = target_probs(logits, params)
    with torch.device("meta"):
        probs = target_probs(logits, params)
    assert probs.device == logits.device
    assert torch.equal(probs, expected)


# Significance of each chi-square below: a correct verifier fails one check with probability
# 1e-6 (for its fixed seed, a priori), so each test, with at most 5 checks, fails falsely with
# probability below 5e-6.
P_MIN = 1e-6
MULTI_DRAW_COUNT = 20000
# Per case: the drafts, and the target's rows 0..k (row j: the distribution at draft position
# j; row k: the bonus token's). Every row differs from every other, and each draft's
# probability differs from the row before's and row 0's, at every position.
MULTI_DRAFT_CASES = {
    "four drafts": (
        [1, 3, 0, 4],
        [
            [0.10, 0.55, 0.05, 0.10, 0.15, 0.05],
            [0.30, 0.05, 0.05, 0.45, 0.10, 0.05],
            [0.60, 0.05, 0.20, 0.05, 0.05, 0.05],
            [0.05, 0.10, 0.15, 0.05, 0.50, 0.15],
            [0.05, 0.05, 0.10, 0.20, 0.10, 0.50],
        ],
    ),
    # A repeated draft token, one the target is sure of, then one it never takes: position 2
    # always replaces its draft, so nothing reaches the bonus row.
    "three drafts, certain then impossible": (
        [2, 2, 2],
        [
            [0.20, 0.10, 0.40, 0.10, 0.10, 0.10],
            [0.00, 0.00, 1.00, 0.00, 0.00, 0.00],
            [0.25, 0.25, 0.00, 0.25, 0.15, 0.10],
            [0.10, 0.10, 0.10, 0.10, 0.10, 0.50],
        ],
    ),
}


def emitted_counts(
    probs: torch.Tensor, drafts: Sequence[int], num_draws: int, seed: int
) -> list[torch.Tensor]:
    """Per position j in 0..k: counts of the token emitted there, over the draws that kept
    drafts 0..j-1 (those where position j emits a token at all)."""
    generator = torch.Generator().manual_seed(seed)
    counts = [torch.zeros(probs.shape[1]) for _ in range(len(drafts) + 1)]
    for _ in range(num_draws):
        emitted = verify_sampled(probs, drafts, generator)
        # Drafts kept up to the first token that is not its draft, which is the last emitted;
        # all kept: one token more.
        kept = next(
            (
                j
                for j, (token, draft) in enumerate(zip(emitted, drafts, strict=False))
                if token != draft
            ),
            len(drafts),
        )
        assert len(emitted) == kept + 1, (emitted, drafts)
        for position, token in enumerate(emitted):
            counts[position][token] += 1
    return counts


@pytest.mark.parametrize("case", list(MULTI_DRAFT_CASES))
def test_rejection_sampling_keeps_each_positions_target_distribution(case: str) -> None:
    drafts, rows = MULTI_DRAFT_CASES[case]
    probs = torch.tensor(rows)
    counts = emitted_counts(probs, drafts, MULTI_DRAW_COUNT, seed=2024)
    reach = 1.0  # P(position j emits): every draft before it kept
    for position, position_counts in enumerate(counts):
        reached = int(position_counts.sum())
        # How many draws got here is itself the product of the kept drafts' probabilities
        # (a binomial; 6 standard deviations is a two-sided p of 2e-9).
        spread = 6 * (MULTI_DRAW_COUNT * reach * (1 - reach)) ** 0.5
        assert abs(reached - MULTI_DRAW_COUNT * reach) <= spread, (position, reached, reach)
        if reach > 0:
            target = probs[position]
            assert int(position_counts[target == 0].sum()) == 0, (position, position_counts)
            p_value = chi_square_p_value(position_counts, target)
            assert p_value > P_MIN, (position, position_counts.tolist(), p_value)
        if position < len(drafts):
            reach *= float(probs[position, drafts[position]])


def test_the_bonus_token_is_drawn_from_the_row_after_the_last_draft() -> None:
    # Rows 0..2 certain of their drafts: every draw keeps both and draws the bonus from row 2.
    probs = torch.tensor(
        [
            [0.0, 1.0, 0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 1.0, 0.0, 0.0],
            [0.30, 0.05, 0.25, 0.05, 0.30, 0.05],
        ]
    )
    [first, second, bonus] = emitted_counts(probs, [1, 3], 5000, seed=11)
    assert int(first[1]) == int(second[3]) == 5000
    assert int(bonus.sum()) == 5000
    assert chi_square_p_value(bonus, probs[2]) > P_MIN
