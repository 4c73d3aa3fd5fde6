"""``RateHistory``: token rates between successive readings, kept for a sliding window."""

from __future__ import annotations

from collections import deque

import attrs

from metrale_server.tui.metrics_reading import MetricsReading

DEFAULT_WINDOW_S = 60.0


@attrs.frozen(kw_only=True)
class RateSample:
    at: float
    prompt_tokens_per_s: float
    generation_tokens_per_s: float


class RateHistory:
    """Feed readings in time order; the rates of the last ``window_s`` seconds come out.

    A counter that goes down (the server restarted) starts over without a sample.
    """

    def __init__(self, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[RateSample] = deque()
        self._last: tuple[float, MetricsReading] | None = None

    def add(self, at: float, reading: MetricsReading) -> None:
        last = self._last
        self._last = (at, reading)
        if last is None or at <= last[0]:
            return
        then, previous = last
        prompt = reading.num_prompt_tokens - previous.num_prompt_tokens
        generated = reading.num_generation_tokens - previous.num_generation_tokens
        if prompt < 0 or generated < 0:
            self._samples.clear()
            return
        elapsed = at - then
        self._samples.append(
            RateSample(
                at=at,
                prompt_tokens_per_s=prompt / elapsed,
                generation_tokens_per_s=generated / elapsed,
            )
        )
        while self._samples and self._samples[0].at < at - self.window_s:
            self._samples.popleft()

    @property
    def samples(self) -> tuple[RateSample, ...]:
        return tuple(self._samples)

    @property
    def latest(self) -> RateSample | None:
        return self._samples[-1] if self._samples else None
