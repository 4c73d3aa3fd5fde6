"""One request at a time against the fake server: timings, usage, and every failure check."""

from __future__ import annotations

import asyncio

import pytest

from metrale_bench.datasets import BenchRequest
from metrale_bench.load import LoadSpec, run_load
from metrale_bench.outcome import RequestOutcome
from metrale_bench.streaming import SamplingSpec, request_body
from metrale_bench.target import ServerTarget


def _run(url: str, model: str, *, api: str = "completions", max_tokens: int = 5) -> RequestOutcome:
    target = ServerTarget(base_url=url + "/", api="chat" if api == "chat" else "completions")
    prompt = "one two three" if api == "chat" else (1, 2, 3)
    result = asyncio.run(
        run_load(
            target,
            model,
            [BenchRequest(prompt=prompt, max_tokens=max_tokens)],
            load=LoadSpec(),
            sampling=SamplingSpec(),
        )
    )
    (outcome,) = result.outcomes
    assert result.duration_s >= outcome.latency_s
    return outcome


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_a_good_stream(fake_server_url: str, fake_delays_s: tuple[float, float], api: str) -> None:
    first_token_delay_s, token_delay_s = fake_delays_s
    outcome = _run(fake_server_url, "fake-model", api=api, max_tokens=5)
    assert outcome.error is None
    assert outcome.output_tokens == 5
    assert outcome.prompt_tokens == (2 * 3 + 3 if api == "chat" else 3)
    assert outcome.finish_reason == "length"
    assert outcome.ttft_s is not None
    assert outcome.ttft_s >= first_token_delay_s
    # One chunk per token: four gaps. A busy client may read two chunks at once, so only the
    # whole stream is bound by the server's delays, not each gap.
    assert len(outcome.itl_s) == 4
    assert outcome.latency_s >= first_token_delay_s + 4 * token_delay_s
    assert outcome.latency_s >= outcome.ttft_s + sum(outcome.itl_s) - 1e-6


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("broken", "HTTP 500"),
        ("no-usage", "no usage"),
        ("no-finish", "without a finish reason"),
        ("silent", "no text"),
    ],
)
def test_a_bad_stream_is_a_failure(fake_server_url: str, model: str, message: str) -> None:
    outcome = _run(fake_server_url, model)
    assert not outcome.is_success
    assert outcome.error is not None
    assert message in outcome.error


def test_unreachable_server_is_a_failure() -> None:
    outcome = _run("http://127.0.0.1:9", "m")
    assert outcome.error is not None
    assert "Connect" in outcome.error


def test_request_body() -> None:
    body = request_body(
        "completions",
        "m",
        BenchRequest(prompt=(5, 6), max_tokens=3),
        SamplingSpec(temperature=0.5, seed=7, ignore_eos=True),
    )
    assert body == {
        "model": "m",
        "max_tokens": 3,
        "temperature": 0.5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "prompt": [5, 6],
        "seed": 7,
        "ignore_eos": True,
    }
    chat = request_body("chat", "m", BenchRequest(prompt="hi", max_tokens=3), SamplingSpec())
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert "seed" not in chat
    assert "ignore_eos" not in chat
    with pytest.raises(ValueError, match="token ids"):
        request_body("chat", "m", BenchRequest(prompt=(1,), max_tokens=1), SamplingSpec())


def test_max_concurrency_caps_requests_in_flight(fake_server_url: str) -> None:
    from metrale_bench.metrics import max_concurrent_requests

    target = ServerTarget(base_url=fake_server_url)
    requests = [BenchRequest(prompt=(1,), max_tokens=8) for _ in range(6)]
    result = asyncio.run(
        run_load(target, "fake-model", requests, load=LoadSpec(max_concurrency=2),
                 sampling=SamplingSpec())
    )  # fmt: skip
    assert result.num_failed == 0
    assert max_concurrent_requests(result.outcomes) == 2


def test_request_rate_spreads_arrivals(fake_server_url: str) -> None:
    target = ServerTarget(base_url=fake_server_url)
    requests = [BenchRequest(prompt=(1,), max_tokens=2) for _ in range(5)]
    result = asyncio.run(
        run_load(target, "fake-model", requests, load=LoadSpec(request_rate=25.0),
                 sampling=SamplingSpec())
    )  # fmt: skip
    starts = sorted(o.start_s for o in result.outcomes)
    # The last arrival is rescaled to 5 / 25 = 0.2 s after the start: never earlier; later by
    # however long the event loop was late to wake (0.26 s once on a busy CI machine).
    assert starts[-1] >= 0.2 - 0.01
    assert starts[-1] < 0.2 + 0.3
    assert starts[-1] - starts[0] > 0.05  # spread out (scheduled 0.077 .. 0.2 s), not at once
    assert result.duration_s >= 0.2
