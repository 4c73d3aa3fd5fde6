"""Draft verification. Greedy keeps exactly the argmax path; rejection sampling keeps the
target distribution, checked by chi-square tests on a 6-token vocabulary."""

from __future__ import annotations

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
