"""End to end on the bundled default model (SmolLM2-135M-Instruct): ``met serve`` as a
subprocess, called with ``openai``; greedy decoding throughout."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
import torch
from metrale_testing import served

from metrale_bench.server_process import ServerProcess
from metrale_kernels import cpu_features
from metrale_model_arch import Quantization, read_model_config, resolve_model
from metrale_server.devices import resolve_quantization

pytestmark = pytest.mark.slow

SERVED_NAME = "SmolLM2-135M-Instruct.Q4_1"  # the GGUF file's stem
CAPITAL_QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with served(
        ["--device", "cpu", "--max-seq-len", "2048", "--num-kv-blocks", "256"],
        tmp_path_factory.mktemp("serve"),
        ready_timeout_s=180,
    ) as process:
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_health_is_503_while_loading_then_200(server: ServerProcess) -> None:
    answered = [status for status in server.health_statuses if status is not None]
    assert answered[0] in {503, 200}
    assert answered[-1] == 200
    # Loading the default model takes over a second, polled every 20 ms from the start.
    assert 503 in answered, server.health_statuses
    assert 503 not in answered[answered.index(200) :]


# What the boot log says of the weights with no --quantization: q4 (the GGUF's Q4_1 blocks)
# where the CPU has int8 dot products and the native kernels build (the fast path), int8 without
# the native kernels, float32 elsewhere.
WEIGHT_LINES = {
    Quantization.Q4: (
        "dtype: float32; weights: q4; kernels: q4 (Q4_1 blocks) x int8 -> int32 matmuls",
        "Weights (q4 blocks + int8 embeddings and head + float32 norms and activations): "
        "0.09 GiB = embeddings 27.2 MiB + layers 63.4 MiB",
    ),
    Quantization.INT8: (
        "dtype: float32; weights: int8; kernels: int8 x int8 -> int32 matmuls",
        "Weights (int8 per channel + float32 norms and activations): 0.13 GiB = embeddings "
        "27.2 MiB + layers 102.0 MiB",
    ),
    Quantization.NONE: (
        "dtype: float32; weights: none; kernels: float32 matmuls",
        "Weights (float32): 0.50 GiB = embeddings 108.0 MiB + layers 405.1 MiB",
    ),
}


def test_boot_log_lines(server: ServerProcess) -> None:
    log = server.log_text()
    config = read_model_config(resolve_model(None))
    default = resolve_quantization("auto", torch.device("cpu"), torch.float32, config)
    for fact in (
        "model: ",
        "task: generate",
        *WEIGHT_LINES[default],
        f"CPU: {cpu_features().describe()}",
        "device: cpu",
        "KV pool: 256 blocks x 16 tokens",
        "-> 256 blocks x 16 tok/block = 4096 max KV tokens (46080 B/token)",
        "max batch: 256 sequences",
        "max seq len: 2048",
        f"address: http://127.0.0.1:{server.port}/",
    ):
        assert fact in log, log


def test_models_list(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list().data] == [SERVED_NAME]


def test_chat_knows_the_capital_of_france(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=SERVED_NAME,
        messages=CAPITAL_QUESTION,  # type: ignore[arg-type]
        max_tokens=24,
        temperature=0.0,
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.choices[0].finish_reason in {"stop", "length"}


def test_streamed_chat_equals_unstreamed(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(
        model=SERVED_NAME,
        messages=CAPITAL_QUESTION,  # type: ignore[arg-type]
        max_tokens=16,
        temperature=0.0,
    )
    stream = client.chat.completions.create(
        model=SERVED_NAME,
        messages=CAPITAL_QUESTION,  # type: ignore[arg-type]
        max_tokens=16,
        temperature=0.0,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == whole.choices[0].message.content


def test_streamed_completion_equals_unstreamed_with_usage(client: openai.OpenAI) -> None:
    prompt = "The three primary colours are"
    whole = client.completions.create(
        model=SERVED_NAME, prompt=prompt, max_tokens=12, temperature=0.0
    )
    chunks = list(
        client.completions.create(
            model=SERVED_NAME,
            prompt=prompt,
            max_tokens=12,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    usage = chunks[-1].usage
    assert usage is not None
    assert whole.usage is not None
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_n_two_stop_and_logprobs(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=SERVED_NAME,
        prompt="Paris is the capital of",
        max_tokens=12,
        temperature=0.0,
        n=2,
        stop=["."],
        logprobs=1,
    )
    assert sorted(c.index for c in reply.choices) == [0, 1]
    for choice in reply.choices:
        assert "." not in choice.text
        assert choice.finish_reason in {"stop", "length"}
        assert choice.logprobs is not None
        assert choice.logprobs.token_logprobs is not None
        assert all(lp is not None and lp <= 0.0 for lp in choice.logprobs.token_logprobs)
    assert reply.choices[0].text == reply.choices[1].text  # greedy
