"""When each request is sent: all at once, or Poisson / gamma arrivals at a request rate."""

from __future__ import annotations

import random


def arrival_offsets_s(
    num_requests: int, request_rate: float | None, *, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """Send times in seconds from the start, one per request, non-decreasing.

    ``request_rate`` ``None`` sends everything at time 0. Otherwise the gaps follow a gamma
    distribution with shape ``burstiness`` and mean ``1 / request_rate`` (shape 1 is a Poisson
    process; below 1 is burstier, above 1 more regular), and, as ``vllm bench serve`` does, the
    offsets are rescaled so the last one falls at ``num_requests / request_rate`` exactly,
    which steadies throughput across seeds.
    """
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if request_rate is None:
        return [0.0] * num_requests
    if not request_rate > 0:
        raise ValueError(f"request rate must be positive, got {request_rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    rng = random.Random(seed)
    scale = 1.0 / (request_rate * burstiness)
    offsets = []
    elapsed = 0.0
    for _ in range(num_requests):
        elapsed += rng.gammavariate(burstiness, scale)
        offsets.append(elapsed)
    if not offsets or elapsed == 0.0:
        return offsets
    factor = (num_requests / request_rate) / elapsed
    return [offset * factor for offset in offsets]
