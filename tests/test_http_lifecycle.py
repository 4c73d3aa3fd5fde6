"""``met serve`` lifecycle as a subprocess: SIGTERM drains, the drain is bounded, request
timeouts, SIGINT, and a model that fails to load."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from metrale_bench.server_process import ServerProcess

SERVED_NAME = "tiny"
MAX_SEQ_LEN = 4096
# Long enough that a stream is still running a second or two after it starts.
LONG_MAX_TOKENS = 3000


@pytest.fixture(scope="module")
def tiny_model_dir(tiny_model_factory: Callable[[int], Path]) -> Path:
    """A tiny random Llama with a 4k context."""
    return tiny_model_factory(MAX_SEQ_LEN)


def _start(model_dir: Path, log_path: Path, *flags: str, host: str = "127.0.0.1") -> ServerProcess:
    server = ServerProcess.start(
        [
            str(model_dir),
            "--served-model-name",
            SERVED_NAME,
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--num-kv-blocks",
            "1024",
            *flags,
        ],
        host=host,
        log_path=log_path,
    )
    try:
        server.wait_ready(timeout_s=120)
    except BaseException:
        server.stop(timeout_s=5)
        raise
    return server


@pytest.fixture
def started(tiny_model_dir: Path) -> Iterator[list[ServerProcess]]:
    """Servers a test started; any still running at the end are killed."""
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        server.kill()


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120
    )


def _long_stream(client: openai.OpenAI) -> openai.Stream[openai.types.Completion]:
    return client.completions.create(
        model=SERVED_NAME,
        prompt="Count forever:",
        max_tokens=LONG_MAX_TOKENS,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )


def _wait_draining(server: ServerProcess, timeout_s: float) -> httpx.Response:
    """``/health``'s first answer that is not 200 (the signal takes effect asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(f"{server.base_url}/health", timeout=5)
        if response.status_code != 200 or time.monotonic() > deadline:
            return response
        time.sleep(0.02)


@pytest.mark.slow
def test_sigterm_lets_an_in_flight_stream_finish(
    tiny_model_dir: Path, started: list[ServerProcess], tmp_path: Path
) -> None:
    # Neither the drain nor the request times out, however loaded the machine (the drain ends
    # when the stream does).
    server = _start(
        tiny_model_dir, tmp_path / "server.log", "--drain-timeout", "900", "--request-timeout", "0"
    )
    started.append(server)
    stream = _long_stream(_client(server))
    chunks = iter(stream)
    first = [next(chunks) for _ in range(5)]
    server.terminate()
    # The listener stays open for the drain: /health says so, new work is refused.
    health = _wait_draining(server, timeout_s=5)
    assert (health.status_code, health.json()) == (503, {"status": "draining"})
    refused = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"model": SERVED_NAME, "prompt": "Hi", "max_tokens": 2},
        timeout=5,
    )
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "server_shutting_down"
    assert server.is_running()  # still draining: the stream is not done
    assert httpx.get(f"{server.base_url}/health", timeout=5).status_code == 503
    rest = list(chunks)
    text = "".join(c.choices[0].text for c in [*first, *rest] if c.choices)
    finish_reasons = [c.choices[0].finish_reason for c in rest if c.choices]
    usage = [c.usage for c in rest if c.usage is not None]
    assert finish_reasons[-1] == "length"
    assert usage[-1].completion_tokens == LONG_MAX_TOKENS
    assert text
    assert server.wait(timeout_s=15) == 0, server.log_text()
    assert server.health() is None  # the listener closed once the drain ended
    assert "draining" in server.log_text()


@pytest.mark.slow
def test_drain_is_bounded(
    tiny_model_dir: Path, started: list[ServerProcess], tmp_path: Path
) -> None:
    server = _start(tiny_model_dir, tmp_path / "server.log", "--drain-timeout", "0.5")
    started.append(server)
    stream = _long_stream(_client(server))
    chunks = iter(stream)
    next(chunks)
    signalled_at = time.monotonic()
    server.terminate()
    finish_reasons: list[str | None] = []
    try:
        for chunk in chunks:
            finish_reasons.extend(c.finish_reason for c in chunk.choices)
    except (httpx.HTTPError, openai.APIError):
        pass  # an error event (the engine stopped) or a cut connection: both end the stream
    assert "length" not in finish_reasons  # cut short: nowhere near 3000 tokens
    assert server.wait(timeout_s=20) == 0, server.log_text()
    assert time.monotonic() - signalled_at < 20
    log = server.log_text()
    assert "drain timeout" in log
    assert "Traceback" not in log


@pytest.mark.slow
def test_request_timeout_ends_with_finish_reason_timeout(
    tiny_model_dir: Path, started: list[ServerProcess], tmp_path: Path
) -> None:
    server = _start(tiny_model_dir, tmp_path / "server.log", "--request-timeout", "1")
    started.append(server)
    client = _client(server)
    began = time.monotonic()
    reply = client.completions.create(
        model=SERVED_NAME,
        prompt="Count forever:",
        max_tokens=LONG_MAX_TOKENS,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    assert time.monotonic() - began < 10
    assert reply.choices[0].finish_reason == "length"  # OpenAI's reason for a cut output
    assert reply.usage is not None
    assert 0 < reply.usage.completion_tokens < LONG_MAX_TOKENS
    finish_reasons = [c.choices[0].finish_reason for c in _long_stream(client) if c.choices]
    assert finish_reasons[-1] == "length"
    assert "timed out after" in server.log_text()
    assert server.stop(timeout_s=15) == 0


def test_sigint_on_an_idle_server_exits_zero(
    tiny_model_dir: Path, started: list[ServerProcess], tmp_path: Path
) -> None:
    server = _start(tiny_model_dir, tmp_path / "server.log")
    started.append(server)
    server.send_signal(signal.SIGINT)
    assert server.wait(timeout_s=15) == 0, server.log_text()
    log = server.log_text()
    assert "SIGINT: draining" in log
    assert "bound to all interfaces" not in log


def test_a_model_that_fails_to_load_exits_one(
    tmp_path: Path, tiny_model_dir: Path, started: list[ServerProcess]
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (tiny_model_dir / name).exists():
            (broken / name).write_bytes((tiny_model_dir / name).read_bytes())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    server = ServerProcess.start([str(broken), "--device", "cpu"], log_path=tmp_path / "server.log")
    started.append(server)
    assert server.wait(timeout_s=60) == 1
    log = server.log_text()
    assert "cannot load the model" in log
    assert "model.safetensors" in log
