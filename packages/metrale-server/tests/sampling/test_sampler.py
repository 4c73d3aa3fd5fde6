"""The sampler: each logits processor by hand-computed example, seeds, the sampling law."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import attrs
import pytest
import torch

from metrale_server.sampling.params import SamplingParams
from metrale_server.sampling.penalty_state import PenaltyState
from metrale_server.sampling.sampler import SamplerOutput, sample
from metrale_server.sampling.tensors import (
    SamplingRow,
    has_penalty,
    make_seeded_generator,
    prepare_sampling_batch,
)

# Probabilities 0.5, 0.3, 0.15, 0.05 as logits.
NUCLEUS_LOGITS = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()


def make_row(
    params: SamplingParams | None = None,
    *,
    prompt: Sequence[int] = (0,),
    output: Sequence[int] = (),
    eos_token_ids: tuple[int, ...] = (),
    vocab_size: int = 1000,
) -> SamplingRow:
    params = params or SamplingParams()
    generator = None if params.seed is None else make_seeded_generator(params.seed, "cpu")
    penalty = None
    if has_penalty(params):
        penalty = PenaltyState(prompt, output, vocab_size, torch.device("cpu"))
    return SamplingRow(
        params=params,
        num_output_tokens=len(output),
        penalty=penalty,
        generator=generator,
        eos_token_ids=eos_token_ids,
    )


def run(
    logits: torch.Tensor, rows: Sequence[SamplingRow], *, seed: int | None = 0
) -> SamplerOutput:
    batch = prepare_sampling_batch(rows, logits.shape[1], "cpu")
    generator = None if seed is None else make_seeded_generator(seed, "cpu")
    return sample(logits, batch, generator=generator)


def draw_many(logits_row: torch.Tensor, params: SamplingParams, num_rows: int) -> list[int]:
    logits = logits_row.expand(num_rows, -1).contiguous()
    return list(run(logits, [make_row(params)] * num_rows).token_ids)


def processed_logprobs(logits_row: torch.Tensor, row: SamplingRow) -> torch.Tensor:
    """The row's processed log-probabilities over the whole (≤ 20-token) vocabulary."""
    vocab_size = logits_row.shape[0]
    asking = attrs.evolve(
        row,
        params=SamplingParams(
            temperature=0.0,
            logprobs=vocab_size,
            repetition_penalty=row.params.repetition_penalty,
            frequency_penalty=row.params.frequency_penalty,
            presence_penalty=row.params.presence_penalty,
            logit_bias=row.params.logit_bias,
            min_tokens=row.params.min_tokens,
            stop_token_ids=row.params.stop_token_ids,
            ignore_eos=row.params.ignore_eos,
        ),
    )
    entry = run(logits_row[None], [asking]).logprobs[0]
    assert entry is not None
    by_id = torch.empty(vocab_size)
    by_id[list(entry.top_token_ids)] = torch.tensor(entry.top_logprobs)
    return by_id


def test_greedy_is_the_argmax_with_ties_to_the_lowest_id() -> None:
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(1))
    logits[2, 7] = logits[2, 100] = logits[2].max() + 1.0
    output = run(logits, [make_row(SamplingParams(temperature=0.0))] * 6)
    assert output.token_ids == tuple(logits.argmax(dim=-1).tolist())
    assert output.token_ids[2] == 7
    assert output.logprobs == (None,) * 6


def test_a_tiny_temperature_always_samples_the_argmax() -> None:
    logits_row = torch.tensor([1.0, 2.9, 3.0, 2.8, -1.0])
    assert set(draw_many(logits_row, SamplingParams(temperature=1e-3), 500)) == {2}
    assert len(set(draw_many(logits_row, SamplingParams(temperature=1.0), 500))) >= 3


def test_top_k_of_one_equals_greedy() -> None:
    logits = torch.randn(32, 500, generator=torch.Generator().manual_seed(2))
    output = run(logits, [make_row(SamplingParams(temperature=1.5, top_k=1))] * 32)
    assert output.token_ids == tuple(logits.argmax(dim=-1).tolist())


def test_top_k_keeps_the_k_most_likely_tokens() -> None:
    assert set(draw_many(NUCLEUS_LOGITS, SamplingParams(top_k=2), 2000)) == {0, 1}
    assert set(draw_many(NUCLEUS_LOGITS, SamplingParams(top_k=10), 4000)) == {0, 1, 2, 3}


def test_a_small_top_p_keeps_only_the_top_token() -> None:
    logits_row = torch.tensor([1.0, 0.9, 0.8, 0.7, 0.6])
    assert set(draw_many(logits_row, SamplingParams(top_p=0.05), 1000)) == {0}


@pytest.mark.parametrize(
    ("params", "kept"),
    [
        (SamplingParams(top_p=0.75), {0, 1}),  # 0.5 < 0.75 <= 0.8
        (SamplingParams(top_p=0.85), {0, 1, 2}),  # 0.8 < 0.85 <= 0.95
        (SamplingParams(top_p=0.75, top_k=3), {0, 1}),
        (SamplingParams(top_p=0.99, top_k=2), {0, 1}),
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_the_mass(
    params: SamplingParams, kept: set[int]
) -> None:
    assert set(draw_many(NUCLEUS_LOGITS, params, 3000)) == kept


@pytest.mark.parametrize(("min_p", "kept"), [(0.2, {0, 1, 2}), (0.5, {0, 1}), (0.05, {0, 1, 2, 3})])
def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability(
    min_p: float, kept: set[int]
) -> None:
    assert set(draw_many(NUCLEUS_LOGITS, SamplingParams(min_p=min_p), 4000)) == kept


# top_k=3 on every row: the sampler works on the top-k candidates only.
@pytest.mark.parametrize(("top_k", "unfiltered"), [(0, {0, 1, 2, 3}), (3, {0, 1, 2})])
def test_top_p_rows_in_a_mixed_batch_only_filter_themselves(
    top_k: int, unfiltered: set[int]
) -> None:
    logits = NUCLEUS_LOGITS.expand(2000, -1).contiguous()
    rows = [make_row(SamplingParams(top_p=0.6 if i % 2 else 1.0, top_k=top_k)) for i in range(2000)]
    tokens = run(logits, rows).token_ids
    assert set(tokens[1::2]) == {0, 1}
    assert set(tokens[0::2]) == unfiltered


PENALTY_LOGITS = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0, 0.0])


@pytest.mark.parametrize(
    ("params", "expected_logits"),
    [
        # Prompt and output tokens {0, 1, 3}: positive logits halved, negative doubled.
        (SamplingParams(repetition_penalty=2.0), [1.0, -2.0, 0.5, 1.5, -2.0, 0.0]),
        # Output counts: token 1 once, token 3 twice; the prompt token 0 is not penalized.
        (SamplingParams(frequency_penalty=0.5), [2.0, -1.5, 0.5, 2.0, -2.0, 0.0]),
        (SamplingParams(presence_penalty=0.5), [2.0, -1.5, 0.5, 2.5, -2.0, 0.0]),
        (SamplingParams(frequency_penalty=-0.5), [2.0, -0.5, 0.5, 4.0, -2.0, 0.0]),
        (
            SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
            [1.0, -2.75, 0.5, 0.25, -2.0, 0.0],
        ),
    ],
)
def test_penalties_match_hand_computed_logits(
    params: SamplingParams, expected_logits: list[float]
) -> None:
    row = make_row(params, prompt=(0, 1), output=(1, 3, 3), vocab_size=6)
    expected = torch.tensor(expected_logits).log_softmax(dim=-1)
    torch.testing.assert_close(processed_logprobs(PENALTY_LOGITS, row), expected)


def test_a_penalty_changes_the_greedy_choice() -> None:
    greedy = SamplingParams(temperature=0.0, frequency_penalty=1.0)
    output = run(PENALTY_LOGITS[None], [make_row(greedy, output=(3, 3), vocab_size=6)])
    assert output.token_ids == (0,)  # token 3: 3.0 - 2 × 1.0 < 2.0


def test_logit_bias_forces_a_token() -> None:
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(3))
    forced = SamplingParams(temperature=1.0, logit_bias={417: 100.0}, logprobs=1)
    output = run(logits, [make_row(forced)] * 64)
    assert output.token_ids == (417,) * 64
    for entry in output.logprobs:
        assert entry is not None
        assert entry.top_token_ids == (417,)
        assert entry.logprob > -1e-3


def test_logit_bias_is_added_to_the_logits() -> None:
    row = make_row(SamplingParams(logit_bias={1: 2.5, 4: -1.0}))
    expected = torch.tensor([2.0, 1.5, 0.5, 3.0, -3.0, 0.0]).log_softmax(dim=-1)
    torch.testing.assert_close(processed_logprobs(PENALTY_LOGITS, row), expected)


def test_min_tokens_suppresses_eos_and_stop_ids_until_reached() -> None:
    logits_row = torch.tensor([5.0, 1.0, 2.0, 6.0, 0.0])
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=(0,))
    early = make_row(params, output=(1, 1), eos_token_ids=(3,))
    reached = make_row(params, output=(1, 1, 1), eos_token_ids=(3,))
    output = run(logits_row.expand(2, -1).contiguous(), [early, reached])
    assert output.token_ids == (2, 3)
    early_logprobs = processed_logprobs(logits_row, early)
    assert early_logprobs[0] == early_logprobs[3] == -math.inf
    assert torch.isfinite(early_logprobs[[1, 2, 4]]).all()


def test_min_tokens_with_ignore_eos_still_suppresses_stop_ids() -> None:
    logits_row = torch.tensor([5.0, 1.0, 2.0, 6.0, 0.0])
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=(3,), ignore_eos=True)
    output = run(logits_row[None], [make_row(params, eos_token_ids=(0,))])
    assert output.token_ids == (0,)


def seeded_tokens(
    seeded_params: SamplingParams, position: int, num_steps: int, seed: int
) -> list[int]:
    """Tokens a seeded row draws at ``position`` in a batch of mixed rows (alone if < 0)."""
    vocab_size = 1000
    logits_row = torch.randn(vocab_size, generator=torch.Generator().manual_seed(4)) * 0.5
    other_rows = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, top_k=20),
        SamplingParams(temperature=1.0, top_p=0.9, seed=99),
        SamplingParams(temperature=1.2, repetition_penalty=1.3, logprobs=3),
        SamplingParams(temperature=0.7, min_p=0.1),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.0, logit_bias={5: 3.0}),
    ]
    seeded = make_row(seeded_params)
    rows = [seeded] if position < 0 else [make_row(params) for params in other_rows]
    if position >= 0:
        rows.insert(position, seeded)
    logits = torch.randn(len(rows), vocab_size, generator=torch.Generator().manual_seed(5))
    logits[max(position, 0)] = logits_row
    generator = make_seeded_generator(seed, "cpu")
    tokens = []
    for _ in range(num_steps):
        batch = prepare_sampling_batch(rows, vocab_size, "cpu")
        tokens.append(sample(logits, batch, generator=generator).token_ids[max(position, 0)])
    return tokens


@pytest.mark.parametrize(
    "seeded_params",
    [
        SamplingParams(temperature=1.0, seed=1234),
        # Alone it samples among its top-k only; in the mixed batch over the whole vocabulary.
        SamplingParams(temperature=1.0, top_k=300, top_p=0.95, seed=1234),
    ],
)
def test_a_seeded_row_draws_the_same_tokens_alone_or_anywhere_in_a_batch(
    seeded_params: SamplingParams,
) -> None:
    alone = seeded_tokens(seeded_params, position=-1, num_steps=6, seed=0)
    assert seeded_tokens(seeded_params, position=5, num_steps=6, seed=7) == alone
    assert seeded_tokens(seeded_params, position=0, num_steps=6, seed=8) == alone
    assert len(set(alone)) > 1  # one generator, advancing step to step
    other_seed = attrs.evolve(seeded_params, seed=4321)
    assert seeded_tokens(other_seed, position=-1, num_steps=6, seed=0) != alone


def test_a_seeded_top_k_row_ignores_the_top_k_of_its_neighbours() -> None:
    logits = torch.randn(2, 1000, generator=torch.Generator().manual_seed(9))
    draws = []
    for neighbour_top_k in (1, 50, 900):
        seeded = make_row(SamplingParams(temperature=1.0, top_k=50, seed=77))
        rows = [make_row(SamplingParams(top_k=neighbour_top_k)), seeded]
        draws.append([run(logits, rows, seed=neighbour_top_k).token_ids[1] for _ in range(5)])
    assert draws[0] == draws[1] == draws[2]
    assert len(set(draws[0])) > 1


def test_unseeded_rows_follow_the_shared_generator() -> None:
    logits = torch.zeros(64, 1000)
    rows = [make_row()] * 64
    assert run(logits, rows, seed=1).token_ids == run(logits, rows, seed=1).token_ids
    assert run(logits, rows, seed=1).token_ids != run(logits, rows, seed=2).token_ids


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (SamplingParams(temperature=1.0), [0.1, 0.2, 0.3, 0.4]),
        # Temperature 2: probabilities ∝ p^(1/2).
        (SamplingParams(temperature=2.0), [1.0, 2**0.5, 3**0.5, 2.0]),
        (SamplingParams(temperature=1.0, top_k=2), [0.0, 0.0, 3.0, 4.0]),
        (SamplingParams(temperature=2.0, top_k=3), [0.0, 2**0.5, 3**0.5, 2.0]),
        (SamplingParams(temperature=1.0, min_p=0.6), [0.0, 0.0, 3.0, 4.0]),
    ],
)
def test_empirical_frequencies_match_the_distribution(
    params: SamplingParams, expected: list[float]
) -> None:
    num_rows = 20_000
    logits_row = torch.tensor([0.1, 0.2, 0.3, 0.4]).log()
    counts = Counter(draw_many(logits_row, params, num_rows))
    expected_probs = torch.tensor(expected) / sum(expected)
    frequencies = torch.tensor([counts[token_id] / num_rows for token_id in range(4)])
    torch.testing.assert_close(frequencies, expected_probs, atol=0.015, rtol=0.0)


def test_seeded_rows_follow_the_distribution_too() -> None:
    num_rows = 4000
    logits_row = torch.tensor([0.1, 0.2, 0.3, 0.4]).log()
    rows = [make_row(SamplingParams(seed=seed)) for seed in range(num_rows)]
    tokens = run(logits_row.expand(num_rows, -1).contiguous(), rows).token_ids
    counts = Counter(tokens)
    frequencies = torch.tensor([counts[token_id] / num_rows for token_id in range(4)])
    torch.testing.assert_close(frequencies, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.03, rtol=0)


def test_logprobs_are_the_log_softmax_before_temperature_with_top_ids_in_order() -> None:
    logits = torch.randn(4, 200, generator=torch.Generator().manual_seed(6)) * 2
    rows = [
        make_row(SamplingParams(temperature=0.5, logprobs=5)),
        make_row(SamplingParams(temperature=0.0)),
        make_row(SamplingParams(temperature=0.0, logprobs=0)),
        make_row(SamplingParams(temperature=1.0, top_k=3, logprobs=20)),
    ]
    output = run(logits, rows)
    reference = logits.log_softmax(dim=-1)
    assert output.logprobs[1] is None
    for row_index, count in ((0, 5), (2, 0), (3, 20)):
        entry = output.logprobs[row_index]
        assert entry is not None
        chosen = output.token_ids[row_index]
        assert entry.logprob == pytest.approx(reference[row_index, chosen].item(), abs=1e-5)
        expected_values, expected_ids = reference[row_index].topk(count)
        assert entry.top_token_ids == tuple(expected_ids.tolist())
        assert entry.top_logprobs == pytest.approx(expected_values.tolist(), abs=1e-5)
        assert list(entry.top_logprobs) == sorted(entry.top_logprobs, reverse=True)
    assert output.token_ids[3] in reference[3].topk(3).indices.tolist()


def test_rows_not_asking_for_logprobs_get_none() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(7))
    rows = [make_row(SamplingParams(logprobs=2)), make_row(), make_row(SamplingParams(top_k=5))]
    output = run(logits, rows)
    assert output.logprobs[0] is not None
    assert output.logprobs[1:] == (None, None)
    assert run(logits, rows[1:] + rows[1:2]).logprobs == (None, None, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.9),
        SamplingParams(temperature=0.9, top_k=5),
        SamplingParams(temperature=0.9, top_p=0.5, repetition_penalty=1.5, logprobs=2),
    ],
)
def test_the_input_logits_are_never_modified(dtype: torch.dtype, params: SamplingParams) -> None:
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(8)).to(dtype)
    before = logits.clone()
    output = run(logits, [make_row(params, output=(3, 4), vocab_size=100)] * 4)
    assert torch.equal(logits, before)
    assert all(0 <= token_id < 100 for token_id in output.token_ids)


def test_invalid_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="logits shape"):
        run(torch.zeros(2, 10), [make_row()])
    with pytest.raises(ValueError, match="logit_bias"):
        run(torch.zeros(1, 10), [make_row(SamplingParams(logit_bias={10: 1.0}))])
    with pytest.raises(ValueError, match="generator"):
        SamplingRow(params=SamplingParams(seed=1))
    with pytest.raises(ValueError, match="PenaltyState"):
        SamplingRow(params=SamplingParams(presence_penalty=1.0))
    with pytest.raises(ValueError, match="at least one row"):
        prepare_sampling_batch([], 10, "cpu")
