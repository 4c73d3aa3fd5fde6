"""Structured outputs, tool calls and reasoning end to end: ``met serve`` on the bundled default
model as a subprocess, called with the ``openai`` client at temperature 1."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from metrale_testing import served

from metrale_bench.server_process import ServerProcess

pytestmark = pytest.mark.slow

SERVED_NAME = "SmolLM2-135M-Instruct.Q4_1"  # the GGUF file's stem

# Qwen3's conventions on ChatML: tools listed in the system turn, calls as <tool_call> JSON,
# ``enable_thinking=False`` closing an empty think block in the generation prompt.
CHAT_TEMPLATE = """\
{%- if tools %}<|im_start|>system
You may call these functions: {{ tools | tojson }}<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>
{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}
</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}"""

CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "country": {"type": "string", "maxLength": 16},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 40},
        "continent": {"enum": ["Africa", "America", "Asia", "Europe", "Oceania"]},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "country", "population_millions", "continent", "is_capital"],
    "additionalProperties": False,
}
WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER_PARAMETERS,
        },
    }
]
ASK_CITY = [{"role": "user", "content": "Tell me about a big city, as JSON."}]
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("serve")
    template = directory / "qwen3-like.jinja"
    template.write_text(CHAT_TEMPLATE)
    with served(
        [
            "--device",
            "cpu",
            "--max-seq-len",
            "1024",
            "--num-kv-blocks",
            "512",
            "--max-batch-size",
            "16",
            "--chat-template",
            str(template),
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--reasoning-parser",
            "qwen3",
        ],
        directory,
        ready_timeout_s=180,
    ) as process:
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_json_schema_outputs_validate_for_50_seeds(client: openai.OpenAI) -> None:
    def ask(seed: int) -> tuple[str | None, str | None]:
        response = client.chat.completions.create(
            model=SERVED_NAME,
            messages=ASK_CITY,  # type: ignore[arg-type]
            temperature=1.0,
            seed=seed,
            max_tokens=160,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True},
            },
        )
        choice = response.choices[0]
        return choice.finish_reason, choice.message.content

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(50)))
    for finish_reason, content in answers:
        assert finish_reason == "stop", content
        assert content is not None
        jsonschema.validate(json.loads(content), CITY_SCHEMA)


def test_regex_and_choice_outputs_match(client: openai.OpenAI) -> None:
    pattern = r"[A-Z][a-z]{2,9}, [A-Z][a-z]{2,9}"
    for seed in range(4):
        response = client.chat.completions.create(
            model=SERVED_NAME,
            messages=ASK_WEATHER,  # type: ignore[arg-type]
            temperature=1.0,
            seed=seed,
            max_tokens=32,
            extra_body={"structured_outputs": {"regex": pattern}},
        )
        assert re.fullmatch(pattern, response.choices[0].message.content or "")
        choices = ["sunny", "rainy", "cloudy"]
        response = client.chat.completions.create(
            model=SERVED_NAME,
            messages=ASK_WEATHER,  # type: ignore[arg-type]
            temperature=1.0,
            seed=seed,
            max_tokens=8,
            extra_body={"guided_choice": choices},
        )
        assert response.choices[0].message.content in choices


def streamed_calls(stream: Any) -> tuple[list[tuple[str, str]], str | None]:
    calls: dict[int, list[str]] = {}
    finish_reason = None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish_reason = choice.finish_reason or finish_reason
        for delta in choice.delta.tool_calls or []:
            if delta.index not in calls:
                assert delta.id
                assert delta.function.name
                calls[delta.index] = [delta.function.name, ""]
            calls[delta.index][1] += delta.function.arguments or ""
    return [(name, arguments) for name, arguments in calls.values()], finish_reason


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_forced_tool_calls_validate_streamed_and_not(
    client: openai.OpenAI, tool_choice: Any
) -> None:
    expected_finish = "tool_calls" if tool_choice == "required" else "stop"
    for seed in range(5):
        request: dict[str, Any] = {
            "model": SERVED_NAME,
            "messages": ASK_WEATHER,
            "tools": TOOLS,
            "tool_choice": tool_choice,
            "temperature": 1.0,
            "seed": seed,
            "max_tokens": 96,
        }
        choice = client.chat.completions.create(**request).choices[0]
        assert choice.finish_reason == expected_finish
        calls = [
            (call.function.name, call.function.arguments)  # type: ignore[union-attr]
            for call in choice.message.tool_calls or []
        ]
        assert calls
        for name, arguments in calls:
            assert name == "get_weather"
            jsonschema.validate(json.loads(arguments), WEATHER_PARAMETERS)
        streamed, finish_reason = streamed_calls(
            client.chat.completions.create(**request, stream=True)
        )
        assert (streamed, finish_reason) == (calls, expected_finish)


def test_reasoning_split_whole_and_streamed(client: openai.OpenAI) -> None:
    # The grammar makes the small model think out loud in the format the parser reads.
    request: dict[str, Any] = {
        "model": SERVED_NAME,
        "messages": ASK_WEATHER,
        "temperature": 1.0,
        "seed": 3,
        "max_tokens": 64,
        "extra_body": {"guided_regex": r"<think>[a-z ]{1,40}</think>[A-Za-z ]{1,40}"},
    }
    message = client.chat.completions.create(**request).choices[0].message
    reasoning = message.reasoning_content  # type: ignore[attr-defined]
    assert re.fullmatch(r"[a-z ]{1,40}", reasoning)
    assert re.fullmatch(r"[A-Za-z ]{1,40}", message.content or "")
    parts: dict[str, str] = {"reasoning_content": "", "content": ""}
    for chunk in client.chat.completions.create(**request, stream=True):
        for key in parts:
            parts[key] += getattr(chunk.choices[0].delta, key, None) or ""
    assert parts == {"reasoning_content": reasoning, "content": message.content}


def test_template_sees_tools_calls_and_kwargs(server: ServerProcess, client: openai.OpenAI) -> None:
    import httpx

    conversation = [
        *ASK_WEATHER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "18 degrees"},
    ]

    def rendered(**body: Any) -> str:
        response = httpx.post(f"{server.base_url}/tokenize", json=body, timeout=30)
        assert response.status_code == 200, response.text
        tokens = response.json()["tokens"]
        detokenized = httpx.post(f"{server.base_url}/detokenize", json={"tokens": tokens})
        text: str = detokenized.json()["prompt"]
        return text

    text = rendered(messages=conversation)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert rendered(messages=ASK_WEATHER, chat_template_kwargs={"enable_thinking": False}).endswith(
        "<think>\n\n</think>\n\n"
    )
    # The whole conversation also runs (auto tool choice through the hermes parser).
    response = client.chat.completions.create(
        model=SERVED_NAME,
        messages=conversation,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
    )
    # Greedy, the model answers from the tool's result in prose ("The weather in Paris is
    # quite pleasant, ..."), longer than 8 tokens: no call is parsed, and the answer is cut.
    choice = response.choices[0]
    assert choice.message.tool_calls is None, choice.message
    assert choice.message.content
    assert response.usage is not None
    assert response.usage.completion_tokens == 8
    assert choice.finish_reason == "length"


def test_log_names_the_parsers(server: ServerProcess) -> None:
    assert re.search(r"auto read as hermes; reasoning: qwen3", server.log_text())
