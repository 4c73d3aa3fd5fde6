from __future__ import annotations

import math

import pytest

from metrale_server.tui.histogram import BucketCounts


def test_quantiles_interpolate_inside_the_bucket() -> None:
    buckets = BucketCounts(upper_bounds=(1.0, 2.0, 4.0, math.inf), cumulative_counts=(2, 6, 8, 8))
    assert buckets.count == 8
    assert buckets.quantile(0.25) == pytest.approx(1.0)  # rank 2: the top of the first bucket
    assert buckets.quantile(0.5) == pytest.approx(1.5)  # rank 4: halfway through (1, 2]
    assert buckets.quantile(0.875) == pytest.approx(3.0)  # rank 7: halfway through (2, 4]
    assert buckets.quantile(0.0) == pytest.approx(0.0)


def test_a_quantile_in_the_inf_bucket_is_the_last_finite_bound() -> None:
    buckets = BucketCounts(upper_bounds=(0.5, math.inf), cumulative_counts=(1, 4))
    assert buckets.quantile(0.9) == 0.5


def test_no_observations_has_no_quantile() -> None:
    assert BucketCounts().quantile(0.5) is None
    empty = BucketCounts(upper_bounds=(1.0, math.inf), cumulative_counts=(0, 0))
    assert empty.quantile(0.9) is None


def test_q_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match="q must be in"):
        BucketCounts().quantile(1.5)
