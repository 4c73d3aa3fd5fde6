"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) on the tiny random
Llama, through the official ``anthropic`` client: the same prompt and output as the chat route,
streamed messages equal to whole ones, tools forced by the grammar, thinking blocks, auth and
Anthropic's error shape."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from .conftest import RunningServer, greedy_chat
from .test_api_tools import TIME_PARAMETERS, WEATHER_PARAMETERS

anthropic = pytest.importorskip("anthropic")

MODEL = "tiny-llama"
SYSTEM = "You are terse."
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another one?"},
]
GREEDY = {"temperature": 0}  # the client sends sampling fields only through extra_body
WEATHER_SCHEMA = WEATHER_PARAMETERS
TIME_SCHEMA = TIME_PARAMETERS
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": WEATHER_SCHEMA,
    },
    {"name": "get_time", "input_schema": TIME_SCHEMA},
]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": tool["name"],
            **({"description": tool["description"]} if "description" in tool else {}),
            "parameters": tool["input_schema"],
        },
    }
    for tool in TOOLS
]


@pytest.fixture
def client(server: RunningServer) -> Iterator[Any]:
    with anthropic.Anthropic(
        base_url=server.base_url, api_key="unused", max_retries=0, timeout=60
    ) as sdk:
        yield sdk
    server.wait_idle()


def arguments(**fields: Any) -> dict[str, Any]:
    """The SDK's arguments for the test conversation, greedy, in 10 tokens; ``fields`` replace
    any of them."""
    body = {
        "model": MODEL,
        "max_tokens": 10,
        "system": SYSTEM,
        "messages": MESSAGES,
        "extra_body": GREEDY,
    }
    return {**body, **fields}


def create(client: Any, **fields: Any) -> Any:
    return client.messages.create(**arguments(**fields))


def streamed(client: Any, **fields: Any) -> Any:
    with client.messages.stream(**arguments(**fields)) as stream:
        return stream.get_final_message()


def without_ids(message: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = message.model_dump(exclude_none=True)
    assert re.fullmatch(r"msg_[0-9a-f]{24}", dumped.pop("id"))
    for block in dumped["content"]:
        if block["type"] == "tool_use":
            assert re.fullmatch(r"toolu_[0-9a-f]{24}", block.pop("id"))
    return dumped


def chat(server: RunningServer, **fields: Any) -> dict[str, Any]:
    return greedy_chat(server, [{"role": "system", "content": SYSTEM}, *MESSAGES], **fields)


def test_a_message_is_the_chat_routes_completion(server: RunningServer, client: Any) -> None:
    message = create(client)
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.model == MODEL
    twin = chat(server)
    [choice] = twin["choices"]
    [block] = message.content
    assert block.type == "text"
    assert block.text == choice["message"]["content"]
    assert message.usage.input_tokens == twin["usage"]["prompt_tokens"]
    assert message.usage.output_tokens == twin["usage"]["completion_tokens"]
    expected = {"length": "max_tokens", "stop": "end_turn"}[choice["finish_reason"]]
    assert message.stop_reason == expected
    assert message.stop_sequence is None
    # System text blocks read like the string.
    blocks = create(client, system=[{"type": "text", "text": SYSTEM}])
    assert without_ids(blocks) == without_ids(message)


def test_streamed_message_equals_the_whole_one(client: Any) -> None:
    whole = create(client, max_tokens=16)
    assert without_ids(streamed(client, max_tokens=16)) == without_ids(whole)
    with client.messages.create(
        model=MODEL, max_tokens=16, system=SYSTEM, messages=MESSAGES, extra_body=GREEDY, stream=True
    ) as events:
        types = [event.type for event in events]
    assert types[0] == "message_start"
    assert types[-2:] == ["message_delta", "message_stop"]
    assert types.count("content_block_start") == types.count("content_block_stop") == 1


def test_event_stream_framing(server: RunningServer) -> None:
    body = {"model": MODEL, "max_tokens": 6, "messages": MESSAGES, "stream": True, **GREEDY}
    response = server.client.post("/v1/messages", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = response.content.split(b"\n\n")
    assert frames[-1] == b""
    events = []
    for frame in frames[:-1]:
        name, data = frame.decode().split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert name == f"event: {payload['type']}"
        events.append(payload)
    assert [event["type"] for event in events[:2]] == ["message_start", "ping"]
    start = events[0]["message"]
    assert start["content"] == []
    assert start["stop_reason"] is None
    assert start["usage"]["output_tokens"] == 0
    deltas = [event for event in events if event["type"] == "content_block_delta"]
    assert all(event["delta"]["type"] == "text_delta" for event in deltas)
    assert events[-1] == {"type": "message_stop"}
    final = events[-2]
    assert final["type"] == "message_delta"
    assert final["usage"]["input_tokens"] == start["usage"]["input_tokens"]
    whole = server.client.post("/v1/messages", json={**body, "stream": False}).json()
    assert final["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    assert final["delta"]["stop_reason"] == whole["stop_reason"]
    text = "".join(event["delta"]["text"] for event in deltas)
    assert [{"type": "text", "text": text}] == whole["content"]


def test_stop_sequences(client: Any) -> None:
    text = create(client, max_tokens=24).content[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), text
    message = create(client, max_tokens=24, stop_sequences=[stop])
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == stop
    prefix = text[: text.index(stop)]
    assert [block.text for block in message.content] == ([prefix] if prefix else [])
    assert without_ids(streamed(client, max_tokens=24, stop_sequences=[stop])) == without_ids(
        message
    )


def test_count_tokens_equals_input_tokens(client: Any) -> None:
    for fields in ({}, {"tools": TOOLS, "tool_choice": {"type": "any"}}):
        message = create(client, max_tokens=1, **fields)
        counted = client.messages.count_tokens(
            model=MODEL, system=SYSTEM, messages=MESSAGES, **fields
        )
        assert counted.input_tokens == message.usage.input_tokens > 0


def test_forced_tool_use_then_tool_result_round_trip(server: RunningServer, client: Any) -> None:
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice = {"type": "tool", "name": "get_weather"}
    message = create(client, messages=question, tools=TOOLS, tool_choice=choice, max_tokens=64)
    assert message.stop_reason == "tool_use"
    [call] = message.content
    assert call.type == "tool_use"
    assert call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER_SCHEMA)
    again = streamed(client, messages=question, tools=TOOLS, tool_choice=choice, max_tokens=64)
    assert without_ids(again) == without_ids(message)

    result = {"type": "tool_result", "tool_use_id": call.id, "content": "18 C, sunny"}
    conversation = [
        *question,
        {"role": "assistant", "content": [block.model_dump() for block in message.content]},
        {"role": "user", "content": [result, {"type": "text", "text": "Summarize."}]},
    ]
    answer = create(client, messages=conversation, tools=TOOLS, tool_choice={"type": "none"})
    assert answer.content
    assert all(block.type == "text" for block in answer.content)
    # The turn reaches the template as the chat route's tool call and tool message.
    chat_turns = [
        {"role": "system", "content": SYSTEM},
        *question,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(call.input)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"},
        {"role": "user", "content": "Summarize."},
    ]
    twin = chat(server, messages=chat_turns, tools=CHAT_TOOLS, tool_choice="none")
    assert answer.usage.input_tokens == twin["usage"]["prompt_tokens"]
    assert answer.content[0].text == twin["choices"][0]["message"]["content"]


@pytest.mark.parametrize("is_parallel", [True, False])
def test_any_tool_calls_validate(client: Any, is_parallel: bool) -> None:
    choice = {"type": "any", "disable_parallel_tool_use": not is_parallel}
    message = create(client, tools=TOOLS, tool_choice=choice, max_tokens=96)
    assert message.stop_reason == "tool_use"
    assert message.content
    for block in message.content:
        assert block.type == "tool_use"
        jsonschema.validate(block.input, SCHEMAS[block.name])
    if not is_parallel:
        assert len(message.content) == 1
    again = streamed(client, tools=TOOLS, tool_choice=choice, max_tokens=96)
    assert without_ids(again) == without_ids(message)


def test_thinking_comes_back_as_a_thinking_block(server: RunningServer, client: Any) -> None:
    thinking = {"type": "enabled", "budget_tokens": 8}
    with server.overridden(reasoning_parser="deepseek_r1"):
        # deepseek_r1 reads an output without </think> (a random model's) as all reasoning.
        message = create(client, thinking=thinking, max_tokens=12)
        again = streamed(client, thinking=thinking, max_tokens=12)
        twin = chat(server, max_tokens=12, chat_template_kwargs={"enable_thinking": True})
    [block] = message.content
    assert block.type == "thinking"
    assert block.thinking == twin["choices"][0]["message"]["reasoning_content"]
    assert block.signature == ""
    assert without_ids(again) == without_ids(message)
    # A thinking block sent back is the assistant turn's reasoning.
    turns = [*MESSAGES[:1], {"role": "assistant", "content": [block.model_dump()]}, MESSAGES[2]]
    counted = client.messages.count_tokens(model=MODEL, messages=turns)
    assert counted.input_tokens > 0


def test_x_api_key_and_bearer_auth(server: RunningServer) -> None:
    with server.overridden(api_keys=("k1",)):
        for credentials in ({"api_key": "k1"}, {"auth_token": "k1", "api_key": None}):
            with anthropic.Anthropic(base_url=server.base_url, max_retries=0, **credentials) as sdk:
                assert create(sdk, max_tokens=2).usage.output_tokens > 0
        with (
            anthropic.Anthropic(base_url=server.base_url, api_key="nope", max_retries=0) as sdk,
            pytest.raises(anthropic.AuthenticationError) as refused,
        ):
            create(sdk, max_tokens=2)
        assert refused.value.status_code == 401
        assert refused.value.body["error"]["type"] == "authentication_error"
        assert "x-api-key" in refused.value.body["error"]["message"]
        # x-api-key opens the OpenAI routes too; their errors keep OpenAI's shape.
        assert server.client.get("/v1/models", headers={"x-api-key": "k1"}).status_code == 200
        openai_refusal = server.client.get("/v1/models", headers={"x-api-key": "nope"})
        assert openai_refusal.status_code == 401
        assert openai_refusal.json()["error"]["code"] == "invalid_api_key"
    server.wait_idle()


def anthropic_error(response: Any, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == error_type
    assert set(body["error"]) == {"type", "message"}
    message: str = body["error"]["message"]
    return message


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"messages": []}, "messages"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "messages[0].content[0].source.type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages[0].content[0].type",
        ),
        ({"messages": [*MESSAGES, {"role": "assistant", "content": "Re"}]}, "messages[3].role"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}],
                    }
                ]
            },
            "messages[0].content[0].tool_use_id",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
        ({"tool_choice": {"type": "any"}}, "tool_choice.type"),
        ({"tools": TOOLS}, "tool_choice"),  # auto needs --tool-call-parser
        ({"tools": [{"name": "f", "input_schema": []}]}, "tools[0].input_schema"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
        ({"thinking": {"type": "enabled", "budget_tokens": 4}}, "thinking"),
        ({"thinking": {"type": "enabled", "budget_tokens": 99}}, "thinking.budget_tokens"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"temperature": 3}, "temperature"),
        ({"service_tier": "auto"}, "service_tier"),
    ],
)
def test_bad_requests_are_invalid_request_errors_naming_the_field(
    server: RunningServer, fields: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "max_tokens": 10, "messages": MESSAGES, **fields}
    response = server.client.post("/v1/messages", json=body)
    message = anthropic_error(response, 400, "invalid_request_error")
    assert message.startswith(f"{param}:"), message


def test_the_client_raises_anthropics_errors(client: Any) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad_role:
        create(client, messages=[{"role": "tool", "content": "x"}])
    assert bad_role.value.body["error"]["type"] == "invalid_request_error"
    assert bad_role.value.body["error"]["message"].startswith("messages[0].role:")
    with pytest.raises(anthropic.BadRequestError) as bad_choice:
        create(client, tools=TOOLS, tool_choice={"type": "sometimes"})
    assert bad_choice.value.body["error"]["message"].startswith("tool_choice.type:")
    with pytest.raises(anthropic.NotFoundError) as unknown_model:
        create(client, model="claude-opus-4-1")
    assert unknown_model.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as on_count:
        client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": []}])
    assert on_count.value.body["error"]["message"].startswith("messages[0].content:")


def test_route_errors_take_anthropics_shape(server: RunningServer) -> None:
    anthropic_error(server.client.get("/v1/messages"), 405, "invalid_request_error")
    anthropic_error(server.client.post("/v1/messages/batches", json={}), 404, "not_found_error")
    message = anthropic_error(
        server.client.post(
            "/v1/messages", content=b"{", headers={"content-type": "application/json"}
        ),
        400,
        "invalid_request_error",
    )
    assert "not valid JSON" in message
    with server.overridden(max_body_bytes=100):
        body = {
            "model": MODEL,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "x" * 200}],
        }
        anthropic_error(server.client.post("/v1/messages", json=body), 413, "request_too_large")
    # The OpenAI routes keep OpenAI's shape.
    openai_error = server.client.post("/v1/chat/completions", json={"messages": []}).json()
    assert set(openai_error) == {"error"}
    assert openai_error["error"]["param"] == "messages"


@pytest.mark.parametrize("is_streamed", [False, True])
def test_an_engine_failure_is_an_api_error(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch, is_streamed: bool
) -> None:
    original_step = server.engine.core.step
    num_calls = 0

    def failing_once() -> Any:
        nonlocal num_calls
        num_calls += 1
        if num_calls == 1:
            raise RuntimeError("injected engine failure")
        return original_step()

    monkeypatch.setattr(server.engine.core, "step", failing_once)
    body = {"model": MODEL, "max_tokens": 4, "messages": MESSAGES, "stream": is_streamed}
    response = server.client.post("/v1/messages", json=body)
    if is_streamed:
        assert response.status_code == 200
        frames = response.content.split(b"\n\n")
        assert frames[-1] == b""
        name, data = frames[-2].split(b"\n")
        assert name == b"event: error"
        error = json.loads(data.removeprefix(b"data: "))
        assert error["type"] == "error"
        message = error["error"]["message"]
        assert error["error"]["type"] == "api_error"
    else:
        message = anthropic_error(response, 500, "api_error")
    assert re.search(r"err-[0-9a-f]{16}", message)
    assert "injected engine failure" not in message
    monkeypatch.undo()
    server.wait_idle()
