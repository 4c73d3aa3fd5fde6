from __future__ import annotations

import statistics

import pytest

from metrale_bench.arrivals import arrival_offsets_s


def test_no_rate_sends_everything_at_once() -> None:
    assert arrival_offsets_s(5, None) == [0.0] * 5


def test_offsets_are_rescaled_to_n_over_rate() -> None:
    offsets = arrival_offsets_s(40, 8.0, seed=3)
    assert offsets[-1] == pytest.approx(40 / 8.0)
    assert offsets == sorted(offsets)
    assert offsets[0] > 0


def test_same_seed_same_arrivals() -> None:
    assert arrival_offsets_s(20, 2.0, seed=1) == arrival_offsets_s(20, 2.0, seed=1)
    assert arrival_offsets_s(20, 2.0, seed=1) != arrival_offsets_s(20, 2.0, seed=2)


def _gap_cv(burstiness: float) -> float:
    offsets = arrival_offsets_s(4000, 10.0, burstiness=burstiness, seed=0)
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    return statistics.pstdev(gaps) / statistics.mean(gaps)


def test_burstiness_is_the_gamma_shape() -> None:
    # A gamma's coefficient of variation is 1 / sqrt(shape): Poisson 1, shape 4 → 0.5,
    # shape 0.25 → 2.
    assert _gap_cv(1.0) == pytest.approx(1.0, rel=0.1)
    assert _gap_cv(4.0) == pytest.approx(0.5, rel=0.1)
    assert _gap_cv(0.25) == pytest.approx(2.0, rel=0.15)


@pytest.mark.parametrize(("rate", "burstiness"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)])
def test_bad_parameters_are_refused(rate: float, burstiness: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        arrival_offsets_s(3, rate, burstiness=burstiness)
