"""n-gram speculative decoding on the bundled default model: on prompts that ask to repeat a
passage the drafts are mostly kept, and greedy outputs match plain decoding token for token,
offline and through ``met serve`` (eager layer steps, as every test here runs them)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from metrale_testing import served

from metrale_bench.server_process import ServerProcess
from metrale_server import LLM, SamplingParams
from metrale_server.speculative_config import SpeculativeConfig

pytestmark = pytest.mark.slow

SERVED_NAME = "SmolLM2-135M-Instruct.Q4_1"
PASSAGE = (
    "The lighthouse stood on a rock at the mouth of the harbour. Every evening the keeper "
    "climbed the ninety steps, trimmed the wick and wrote the weather in a leather book."
)
ASKS = [
    f"Repeat the following passage exactly:\n\n{PASSAGE}",
    f"Rewrite this passage with 'keeper' replaced by 'guardian':\n\n{PASSAGE}",
    f"Copy the passage below, then stop.\n\n{PASSAGE}",
]
SPEC = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=4)
MAX_TOKENS = 48


def chat_texts(llm: LLM) -> list[str]:
    """Greedy answers to ``ASKS``, rendered as ``met serve`` renders a chat."""
    loaded = llm.engine.loaded
    prompts = [
        {
            "prompt_token_ids": loaded.tokenizer.encode(
                loaded.render_chat([{"role": "user", "content": ask}]), add_special_tokens=False
            )
        }
        for ask in ASKS
    ]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [output.outputs[0].text for output in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def plain_texts() -> list[str]:
    return chat_texts(LLM(None, max_batch_size=4))


def test_offline_drafts_are_kept_and_greedy_is_unchanged(plain_texts: list[str]) -> None:
    llm = LLM(None, max_batch_size=4, speculative_config=SPEC)
    assert chat_texts(llm) == plain_texts
    stats = llm.engine.stats
    assert stats.num_accepted_tokens >= 0.4 * stats.num_draft_tokens > 0, stats


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with served(
        [
            "--device",
            "cpu",
            "--max-seq-len",
            "1024",
            "--num-kv-blocks",
            "256",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 4}',
        ],
        tmp_path_factory.mktemp("serve"),
        ready_timeout_s=180,
    ) as process:
        yield process


def test_served_greedy_is_unchanged(server: ServerProcess, plain_texts: list[str]) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    for ask, expected in zip(ASKS, plain_texts, strict=True):
        response = client.chat.completions.create(
            model=SERVED_NAME,
            messages=[{"role": "user", "content": ask}],
            temperature=0,
            max_tokens=MAX_TOKENS,
            extra_body={"ignore_eos": True},
        )
        assert response.choices[0].message.content == expected
    assert "speculative decoding: ngram, up to 4 draft tokens" in server.log_text()


TOPICS = ["the harbour", "a train", "the river", "a garden", "the market"]
FORMS = ["Repeat exactly: {p}", "Summarize: {p}", "Continue the story: {p}", "Copy: {p} {p}"]


def twenty_prompts() -> list[str]:
    return [form.format(p=f"{PASSAGE} It was about {topic}.") for topic in TOPICS for form in FORMS]


@pytest.mark.parametrize("quantization", ["q4", "int8"])
def test_speculation_keeps_greedy_text_for_twenty_prompts(quantization: str) -> None:
    """The verifying forward computes each row as the one-row decode step does (row
    invariance), so a near-tie can no longer flip under a quantized format."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    prompts = twenty_prompts()
    plain = LLM(None, quantization=quantization, max_batch_size=20).generate(prompts, params)
    speculative = LLM(None, quantization=quantization, max_batch_size=20, speculative_config=SPEC)
    drafted = speculative.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in drafted] == [o.outputs[0].token_ids for o in plain]
    assert speculative.engine.stats.num_accepted_tokens > 0
