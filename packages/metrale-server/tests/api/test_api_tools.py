"""Tool calling and reasoning over HTTP on the tiny random Llama: ``required`` and named
choices are enforced by the grammar, so even a random model's calls must validate."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest

from .conftest import RunningServer

WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": WEATHER_PARAMETERS,
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMETERS}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def post_chat(server: RunningServer, **body: Any) -> Any:
    response = server.client.post(
        "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 128, **body}
    )
    assert response.status_code == 200, response.text
    return response.json()


def stream_chat(server: RunningServer, **body: Any) -> list[Any]:
    raw = server.client.post(
        "/v1/chat/completions",
        json={"messages": MESSAGES, "max_tokens": 128, "stream": True, **body},
    ).content
    return [event for event in server.parse_sse(raw) if event["choices"]]


def join_streamed_calls(events: list[Any]) -> list[dict[str, Any]]:
    """OpenAI's client-side assembly: the first delta of a call brings id and name, later ones
    argument fragments."""
    calls: dict[int, dict[str, Any]] = {}
    for event in events:
        for delta in event["choices"][0]["delta"].get("tool_calls", []):
            index = delta["index"]
            if index not in calls:
                assert delta["id"].startswith("call_")
                assert delta["type"] == "function"
                assert delta["function"]["name"]
                calls[index] = {"name": delta["function"]["name"], "arguments": ""}
            else:
                assert "name" not in delta["function"]
            calls[index]["arguments"] += delta["function"]["arguments"]
    return [calls[index] for index in sorted(calls)]


def whole_calls(body: Any) -> list[dict[str, Any]]:
    message = body["choices"][0]["message"]
    return [
        {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        for call in message.get("tool_calls") or []
    ]


@pytest.mark.parametrize("seed", range(4))
def test_named_function_call_validates(server: RunningServer, seed: int) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    body = post_chat(server, tools=TOOLS, tool_choice=choice, seed=seed)
    [result] = body["choices"]
    assert result["finish_reason"] == "stop"
    assert result["message"]["content"] is None
    [call] = whole_calls(body)
    assert call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER_PARAMETERS)
    assert join_streamed_calls(stream_chat(server, tools=TOOLS, tool_choice=choice, seed=seed)) == [
        call
    ]


@pytest.mark.parametrize("seed", range(4))
def test_required_yields_calls_that_validate(server: RunningServer, seed: int) -> None:
    body = post_chat(server, tools=TOOLS, tool_choice="required", seed=seed, temperature=1.0)
    [result] = body["choices"]
    assert result["finish_reason"] == "tool_calls"
    calls = whole_calls(body)
    assert calls
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
    events = stream_chat(server, tools=TOOLS, tool_choice="required", seed=seed, temperature=1.0)
    assert join_streamed_calls(events) == calls
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_no_parallel_calls_means_one(server: RunningServer) -> None:
    for seed in range(3):
        body = post_chat(
            server, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, seed=seed
        )
        assert len(whole_calls(body)) == 1


def test_auto_needs_a_tool_call_parser(server: RunningServer) -> None:
    response = server.client.post(
        "/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS, "max_tokens": 4}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tool_choice"
    assert "--tool-call-parser" in response.json()["error"]["message"]
    with server.overridden(tool_call_parser="hermes"):
        body = post_chat(server, tools=TOOLS, max_tokens=16, seed=0)
    # A random model writes no <tool_call>: its text is content, finish_reason unchanged.
    assert body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "length"
    body = post_chat(server, tools=TOOLS, tool_choice="none", max_tokens=4)
    assert "tool_calls" not in body["choices"][0]["message"]


def test_tool_conversation_renders(server: RunningServer) -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    ]
    body = post_chat(server, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=4)
    assert body["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, None),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        (
            {
                "tools": TOOLS,
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "response_format",
        ),
        ({"tools": [TOOLS[0], TOOLS[0]], "tool_choice": "required"}, "tools"),
        (
            {"messages": [{"role": "tool", "content": "x"}], "tools": TOOLS, "tool_choice": "none"},
            "messages[0].tool_call_id",
        ),
        ({"messages": [{"role": "user", "content": "x", "audio": {}}]}, "messages[0].audio"),
    ],
)
def test_bad_tools_are_400s_naming_the_field(
    server: RunningServer, body: dict[str, Any], param: str | None
) -> None:
    response = server.client.post(
        "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4, **body}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] is not None
    if param is not None:
        assert error["param"] == param, error
    server.wait_idle()


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_reasoning_is_split_whole_and_streamed(server: RunningServer, parser: str) -> None:
    forced = {"structured_outputs": {"regex": "<think>[a-z]{1,12}</think>[a-z]{1,12}"}, "seed": 5}
    with server.overridden(reasoning_parser=parser):
        message = post_chat(server, **forced)["choices"][0]["message"]
        events = stream_chat(server, **forced)
    reasoning, content = message["reasoning_content"], message["content"]
    assert re.fullmatch("[a-z]{1,12}", reasoning)
    assert re.fullmatch("[a-z]{1,12}", content)
    deltas = [event["choices"][0]["delta"] for event in events]
    assert "".join(delta.get("reasoning_content", "") for delta in deltas) == reasoning
    assert "".join(delta.get("content", "") for delta in deltas) == content


def test_a_json_grammar_skips_the_reasoning_parser(server: RunningServer) -> None:
    # The grammar holds from the first token: the output is the JSON, never reasoning.
    with server.overridden(reasoning_parser="deepseek_r1"):
        message = post_chat(server, response_format={"type": "json_object"}, seed=2)["choices"][0][
            "message"
        ]
        named = {"type": "function", "function": {"name": "get_time"}}
        called = post_chat(server, tools=TOOLS, tool_choice=named, seed=2)["choices"][0]
    assert "reasoning_content" not in message
    assert message["content"].startswith("{")
    assert json.loads(called["message"]["tool_calls"][0]["function"]["arguments"])["zone"]


def test_marker_formats_keep_special_tokens(server: RunningServer) -> None:
    # Mistral's [TOOL_CALLS] and GLM's tags are special tokens: with those parsers an auto
    # request's output keeps special tokens, unless the request says otherwise.
    special = server.engine.loaded.tokenizer.eos_token_ids[0]
    body = {"tools": TOOLS, "max_tokens": 3, "seed": 0, "logit_bias": {str(special): 100}}
    for parser, expected in (("mistral", True), ("hermes", False)):
        with server.overridden(tool_call_parser=parser):
            message = post_chat(server, **body, ignore_eos=True)["choices"][0]["message"]
        token = server.engine.loaded.tokenizer.decode([special])
        assert (token in (message["content"] or "")) is expected, (parser, message)
    with server.overridden(tool_call_parser="mistral"):
        message = post_chat(server, **body, ignore_eos=True, skip_special_tokens=True)
    assert token not in (message["choices"][0]["message"]["content"] or "")
