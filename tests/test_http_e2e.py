"""End to end: ``met serve`` as a subprocess on a tiny random Llama, called with ``openai``.

Greedy decoding throughout, so a streamed reply must equal the same request unstreamed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from metrale_testing import served

from metrale_bench.server_process import ServerProcess
from metrale_model_arch import Tokenizer

SERVED_NAME = "tiny-llama"
MAX_SEQ_LEN = 512
PROMPT = "The quick brown fox jumps over the lazy dog. Then"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three colours."},
]


@pytest.fixture(scope="module")
def tiny_model_dir(tiny_model_factory: Callable[[int], Path]) -> Path:
    return tiny_model_factory(MAX_SEQ_LEN)


API_KEY = "key-two"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<<{{ m['role'] }}>> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<<assistant>> {% endif %}"
)


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    files = tmp_path_factory.mktemp("serve-files")
    (files / "keys.txt").write_text(f"key-one\n\n  {API_KEY}  \n")
    (files / "chat.jinja").write_text(CHAT_TEMPLATE)
    with served(
        [
            str(tiny_model_dir),
            "--served-model-name",
            SERVED_NAME,
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--max-batch-size",
            "8",
            "--num-kv-blocks",
            "512",
            "--api-key-file",
            str(files / "keys.txt"),
            "--api-key",
            "key-three",
            "--chat-template",
            str(files / "chat.jinja"),
        ],
        files,
        ready_timeout_s=120,
    ) as process:
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)


def test_health_goes_from_loading_to_ready(server: ServerProcess) -> None:
    answered = [status for status in server.health_statuses if status is not None]
    assert answered, server.health_statuses
    assert set(answered) <= {503, 200}
    assert answered[-1] == 200
    assert 503 not in answered[answered.index(200) :]


def test_models_list_names_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [model.id for model in models.data] == [SERVED_NAME]


def test_completion_usage_counts_tokens(
    client: openai.OpenAI, default_tokenizer: Tokenizer
) -> None:
    reply = client.completions.create(
        model=SERVED_NAME, prompt=PROMPT, max_tokens=12, temperature=0.0
    )
    choice = reply.choices[0]
    assert reply.model == SERVED_NAME
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(
        default_tokenizer.encode(PROMPT, add_special_tokens=True)
    )
    assert 1 <= reply.usage.completion_tokens <= 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    if choice.finish_reason == "length":
        assert reply.usage.completion_tokens == 12
    else:
        assert choice.finish_reason == "stop"


def test_streamed_completion_equals_unstreamed(client: openai.OpenAI) -> None:
    whole = client.completions.create(
        model=SERVED_NAME, prompt=PROMPT, max_tokens=24, temperature=0.0
    )
    stream = client.completions.create(
        model=SERVED_NAME,
        prompt=PROMPT,
        max_tokens=24,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces: list[str] = []
    finish_reasons: list[str | None] = []
    usages = []
    for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.text)
            finish_reasons.append(choice.finish_reason)
        if chunk.usage is not None:
            usages.append(chunk.usage)
    assert len(pieces) > 1
    assert "".join(pieces) == whole.choices[0].text
    assert finish_reasons[-1] == whole.choices[0].finish_reason
    assert [u.completion_tokens for u in usages] == [whole.usage.completion_tokens]  # type: ignore[union-attr]


def test_chat_streamed_equals_unstreamed(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(
        model=SERVED_NAME,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=20,
        temperature=0.0,
    )
    message = whole.choices[0].message
    assert message.role == "assistant"
    assert message.content
    stream = client.chat.completions.create(
        model=SERVED_NAME,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=20,
        temperature=0.0,
        stream=True,
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert "".join(pieces) == message.content
    assert whole.usage is not None
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens


def test_n_two_gives_two_choices(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=SERVED_NAME, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=11, n=2
    )
    assert sorted(choice.index for choice in reply.choices) == [0, 1]
    assert all(choice.text for choice in reply.choices)
    chat = client.chat.completions.create(
        model=SERVED_NAME,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0.0,
        n=2,
    )
    texts = [choice.message.content for choice in sorted(chat.choices, key=lambda c: c.index)]
    assert len(texts) == 2
    assert texts[0] == texts[1]  # greedy: both samples are the same
    assert chat.usage is not None
    single = client.chat.completions.create(
        model=SERVED_NAME,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0.0,
    )
    assert single.usage is not None
    assert chat.usage.completion_tokens == 2 * single.usage.completion_tokens
    assert chat.usage.prompt_tokens == single.usage.prompt_tokens


def test_stop_string_cuts_the_text(client: openai.OpenAI) -> None:
    free = client.completions.create(
        model=SERVED_NAME, prompt=PROMPT, max_tokens=32, temperature=0.0
    )
    text = free.choices[0].text
    middle = len(text) // 2
    stop = text[middle : middle + 3]
    assert len(stop) == 3, text
    cut = client.completions.create(
        model=SERVED_NAME, prompt=PROMPT, max_tokens=32, temperature=0.0, stop=[stop]
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_completion_logprobs(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=SERVED_NAME, prompt=PROMPT, max_tokens=6, temperature=0.0, logprobs=3
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None
    assert reply.usage is not None
    assert logprobs.tokens is not None
    assert logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None
    assert len(logprobs.tokens) == reply.usage.completion_tokens
    assert "".join(logprobs.tokens) == reply.choices[0].text
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert chosen is not None
        assert chosen <= 0.0
        assert len(top) == 3
        assert max(top.values()) == pytest.approx(chosen, abs=1e-4)  # greedy picks the top


def test_chat_logprobs(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=SERVED_NAME,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=0.0,
        logprobs=True,
        top_logprobs=2,
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content is not None
    assert reply.usage is not None
    assert len(logprobs.content) == reply.usage.completion_tokens
    for entry in logprobs.content:
        assert entry.logprob <= 0.0
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-4)


def test_concurrent_streams_match_their_single_runs(server: ServerProcess) -> None:
    prompts = [f"Story number {i}: once upon a time" for i in range(8)]

    async def run() -> tuple[list[str], list[str]]:
        async with openai.AsyncOpenAI(
            base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0
        ) as client:

            async def streamed(prompt: str) -> str:
                stream = await client.completions.create(
                    model=SERVED_NAME, prompt=prompt, max_tokens=16, temperature=0.0, stream=True
                )
                return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

            together = await asyncio.gather(*(streamed(p) for p in prompts))
            alone = []
            for prompt in prompts:
                reply = await client.completions.create(
                    model=SERVED_NAME, prompt=prompt, max_tokens=16, temperature=0.0
                )
                alone.append(reply.choices[0].text)
            return list(together), alone

    together, alone = asyncio.run(run())
    assert together == alone


def test_log_has_a_line_per_request_and_no_prompt_text(
    client: openai.OpenAI, server: ServerProcess
) -> None:
    marker = "zebra-okapi-marker"
    reply = client.completions.create(
        model=SERVED_NAME, prompt=f"{marker} {PROMPT}", max_tokens=5, temperature=0.0
    )
    log = server.log_text()
    assert marker not in log
    assert reply.id in log
    line = next(line for line in log.splitlines() if reply.id in line)
    assert reply.usage is not None
    assert re.search(rf"\b{reply.usage.prompt_tokens}\b", line), line
    assert str(reply.choices[0].finish_reason) in line


@pytest.mark.parametrize("key", ["key-one", "key-three"])
def test_every_configured_key_is_accepted(server: ServerProcess, key: str) -> None:
    other = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0)
    assert [model.id for model in other.models.list().data] == [SERVED_NAME]


def test_a_wrong_key_is_refused(server: ServerProcess) -> None:
    other = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="key-four", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        other.models.list()
    assert server.health() == 200  # /health needs no key


def test_chat_template_file_replaces_the_models(
    client: openai.OpenAI, server: ServerProcess, default_tokenizer: Tokenizer
) -> None:
    bos = default_tokenizer.special_tokens_map[
        "bos_token"
    ]  # the template's variables are filled in
    expected = f"{bos}<<system>> You are terse.\n<<user>> Name three colours.\n<<assistant>> "
    reply = client.chat.completions.create(
        model=SERVED_NAME,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=1,
        temperature=0.0,
    )
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(
        default_tokenizer.encode(expected, add_special_tokens=False)
    )
