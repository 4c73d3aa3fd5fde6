"""Cumulative histogram buckets and their quantiles, as Prometheus' ``histogram_quantile``."""

from __future__ import annotations

import math

import attrs


@attrs.frozen(kw_only=True)
class BucketCounts:
    """Cumulative counts per upper bound (ascending; the last bound may be ``inf``)."""

    upper_bounds: tuple[float, ...] = ()
    cumulative_counts: tuple[float, ...] = ()

    @property
    def count(self) -> float:
        return self.cumulative_counts[-1] if self.cumulative_counts else 0.0

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile, interpolated linearly inside its bucket; ``None`` with no
        observations. A quantile in the ``+Inf`` bucket is the last finite bound."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q}")
        if self.count <= 0:
            return None
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for bound, cumulative in zip(self.upper_bounds, self.cumulative_counts, strict=True):
            if cumulative >= rank and cumulative > lower_count:
                if math.isinf(bound):
                    return lower_bound
                fraction = (rank - lower_count) / (cumulative - lower_count)
                return lower_bound + (bound - lower_bound) * fraction
            lower_bound, lower_count = bound, cumulative
        return lower_bound
