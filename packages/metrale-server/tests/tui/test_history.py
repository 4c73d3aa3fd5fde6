from __future__ import annotations

import pytest

from metrale_server.tui.history import RateHistory
from metrale_server.tui.metrics_reading import MetricsReading
from metrale_server.tui.sparkline import sparkline


def reading(prompt: int, generated: int) -> MetricsReading:
    return MetricsReading(num_prompt_tokens=prompt, num_generation_tokens=generated)


def test_rates_are_deltas_over_elapsed_time() -> None:
    history = RateHistory()
    history.add(10.0, reading(100, 10))
    assert history.latest is None
    history.add(12.0, reading(300, 50))
    latest = history.latest
    assert latest is not None
    assert latest.prompt_tokens_per_s == pytest.approx(100.0)
    assert latest.generation_tokens_per_s == pytest.approx(20.0)


def test_only_the_window_is_kept() -> None:
    history = RateHistory(window_s=5.0)
    for second in range(20):
        history.add(float(second), reading(second * 10, second))
    assert [s.at for s in history.samples] == [14.0, 15.0, 16.0, 17.0, 18.0, 19.0]


def test_a_counter_going_down_starts_over() -> None:
    history = RateHistory()
    history.add(0.0, reading(100, 100))
    history.add(1.0, reading(200, 200))
    history.add(2.0, reading(5, 5))
    assert history.samples == ()
    history.add(3.0, reading(15, 10))
    assert history.latest is not None
    assert history.latest.prompt_tokens_per_s == pytest.approx(10.0)


def test_sparkline_scales_to_the_largest_and_pads_to_width() -> None:
    assert sparkline([0.0, 7.0, 3.5], 5) == "  ▁█▄"
    assert sparkline([1.0, 2.0, 3.0, 4.0], 2) == "▆█"
    assert sparkline([], 3) == "   "
    assert sparkline([0.0, 0.0], 2) == "▁▁"
    assert sparkline([1.0], 0) == ""
