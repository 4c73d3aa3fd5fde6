"""OpenAI's Responses API (``/v1/responses``) on the tiny random Llama, through the official
``openai`` client: the same prompt and output as the chat route, streamed responses equal to
whole ones, function calls forced by the grammar, ``text.format`` through the grammar engine,
stored responses (``previous_response_id``, GET, DELETE) and 400s naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from .conftest import RunningServer, greedy_chat
from .test_api_tools import TIME_PARAMETERS, WEATHER_PARAMETERS

openai = pytest.importorskip("openai")

MODEL = "tiny-llama"
INSTRUCTIONS = "You are terse."
INPUT: list[dict[str, Any]] = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another one?"},
]
CHAT_MESSAGES = [{"role": "system", "content": INSTRUCTIONS}, *INPUT]
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": WEATHER_PARAMETERS,
    },
    {"type": "function", "name": "get_time", "parameters": TIME_PARAMETERS},
]
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": tool["name"],
            **({"description": tool["description"]} if "description" in tool else {}),
            "parameters": tool["parameters"],
        },
    }
    for tool in TOOLS
]
ITEM_ID = {"msg": "message", "fc": "function_call", "rs": "reasoning"}


@pytest.fixture
def client(server: RunningServer) -> Iterator[Any]:
    with openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60
    ) as sdk:
        yield sdk
    server.wait_idle()


def create(client: Any, **fields: Any) -> Any:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_output_tokens": 10,
        "instructions": INSTRUCTIONS,
        "input": INPUT,
        "temperature": 0,
    }
    return client.responses.create(**{**body, **fields})


def streamed(client: Any, **fields: Any) -> tuple[list[Any], Any]:
    """The events of a streamed response, and the response its last event carries."""
    with create(client, stream=True, **fields) as stream:
        events = list(stream)
    return events, events[-1].response


def without_ids(response: Any) -> dict[str, Any]:
    """The response without its ids, its time and its cached token count (a prefix cache
    hit varies)."""
    dumped: dict[str, Any] = response.model_dump(exclude_none=True)
    assert re.fullmatch(r"resp_[0-9a-f]{24}", dumped.pop("id"))
    assert dumped.pop("created_at") > 0
    del dumped["usage"]["input_tokens_details"]["cached_tokens"]
    for item in dumped["output"]:
        prefix = {value: key for key, value in ITEM_ID.items()}[item["type"]]
        assert re.fullmatch(rf"{prefix}_[0-9a-f]{{24}}", item.pop("id"))
        if item["type"] == "function_call":
            assert re.fullmatch(r"call_[0-9a-f]{24}", item.pop("call_id"))
    return dumped


def chat(server: RunningServer, **fields: Any) -> dict[str, Any]:
    return greedy_chat(server, CHAT_MESSAGES, **fields)


def test_a_response_is_the_chat_routes_completion(server: RunningServer, client: Any) -> None:
    response = create(client)
    assert response.object == "response"
    assert response.model == MODEL
    assert re.fullmatch(r"resp_[0-9a-f]{24}", response.id)
    twin = chat(server)
    [choice] = twin["choices"]
    [item] = response.output
    assert item.type == "message"
    assert item.role == "assistant"
    assert response.output_text == choice["message"]["content"]
    assert item.content[0].annotations == []
    assert response.usage.input_tokens == twin["usage"]["prompt_tokens"]
    assert response.usage.output_tokens == twin["usage"]["completion_tokens"]
    assert response.usage.total_tokens == twin["usage"]["total_tokens"]
    expected = {"length": "incomplete", "stop": "completed"}[choice["finish_reason"]]
    assert response.status == expected
    if expected == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"
        assert item.status == "incomplete"
    # Echoed request fields.
    assert response.instructions == INSTRUCTIONS
    assert response.temperature == 0
    assert response.max_output_tokens == 10
    assert response.tools == []
    assert response.tool_choice == "auto"
    assert response.text.format.type == "text"
    assert response.store is True
    # A string input is one user message; developer messages are system messages.
    single = create(client, input="Name a colour.", instructions=None)
    twin = chat(server, messages=[{"role": "user", "content": "Name a colour."}])
    assert single.output_text == twin["choices"][0]["message"]["content"]
    assert single.usage.input_tokens == twin["usage"]["prompt_tokens"]
    developer = [{"role": "developer", "content": INSTRUCTIONS}, *INPUT]
    parts = [
        {"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]},
        INPUT[2],
    ]
    assert (
        without_ids(create(client, instructions=None, input=developer))["output"]
        == (without_ids(response)["output"])
    )
    assert without_ids(create(client, input=parts)) == without_ids(response)


def test_streamed_response_equals_the_whole_one(server: RunningServer, client: Any) -> None:
    whole = create(client, max_output_tokens=16, store=False)
    events, final = streamed(client, max_output_tokens=16, store=False)
    assert without_ids(final) == without_ids(whole)
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == f"response.{whole.status}"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert types.count("response.output_item.added") == types.count("response.output_item.done")
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert "".join(deltas) == whole.output_text
    assert events[0].response.status == "in_progress"
    assert events[0].response.output == []
    # The raw frames: an event line naming each payload's type, no [DONE].
    body = {
        "model": MODEL,
        "input": INPUT,
        "max_output_tokens": 4,
        "temperature": 0,
        "stream": True,
        "store": False,
    }
    raw = server.client.post("/v1/responses", json=body)
    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("text/event-stream")
    frames = raw.content.split(b"\n\n")
    assert frames[-1] == b""
    for frame in frames[:-1]:
        name, data = frame.decode().split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert name == f"event: {payload['type']}"


def test_function_call_round_trip(server: RunningServer, client: Any) -> None:
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice = {"type": "function", "name": "get_weather"}
    fields = {"input": question, "tools": TOOLS, "max_output_tokens": 64, "instructions": None}
    response = create(client, tool_choice=choice, **fields)
    assert response.status == "completed"
    [call] = response.output
    assert call.type == "function_call"
    assert call.name == "get_weather"
    assert call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
    with client.responses.stream(
        model=MODEL, temperature=0, tool_choice=choice, **fields
    ) as stream:
        final = stream.get_final_response()
    assert without_ids(final) == without_ids(response)
    required = create(client, tool_choice="required", **fields)
    assert required.output
    for item in required.output:
        assert item.type == "function_call"
        jsonschema.validate(json.loads(item.arguments), SCHEMAS[item.name])

    output = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}
    follow_up = [*question, call.model_dump(exclude_none=True), output]
    answer = create(client, input=follow_up, tools=TOOLS, tool_choice="none", instructions=None)
    assert all(item.type == "message" for item in answer.output)
    chat_turns = [
        *question,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "18 C, sunny"},
    ]
    twin = chat(server, messages=chat_turns, tools=CHAT_TOOLS, tool_choice="none")
    assert answer.usage.input_tokens == twin["usage"]["prompt_tokens"]
    assert answer.output_text == twin["choices"][0]["message"]["content"]


def test_text_format_json_schema_is_enforced(client: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
        "required": ["colour", "n"],
        "additionalProperties": False,
    }
    text = {"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}}
    response = create(client, text=text, max_output_tokens=64)
    assert response.status == "completed", response.output_text
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text.format.type == "json_schema"
    assert response.text.format.name == "pick"
    _, final = streamed(client, text=text, max_output_tokens=64)
    assert final.output_text == response.output_text
    as_object = create(client, text={"format": {"type": "json_object"}}, max_output_tokens=64)
    if as_object.status == "completed":
        assert isinstance(json.loads(as_object.output_text), dict)
    else:  # a random model's object may outrun max_output_tokens
        assert as_object.output_text.lstrip().startswith("{"), as_object.output_text


def test_reasoning_comes_back_as_a_reasoning_item(server: RunningServer, client: Any) -> None:
    with server.overridden(reasoning_parser="deepseek_r1"):
        # deepseek_r1 reads an output without </think> (a random model's) as all reasoning.
        response = create(client, reasoning={"effort": "low"}, max_output_tokens=12)
        events, final = streamed(client, reasoning={"effort": "low"}, max_output_tokens=12)
        twin = chat(server, max_tokens=12)
    [item] = response.output
    assert item.type == "reasoning"
    reasoning = twin["choices"][0]["message"]["reasoning_content"]
    assert [part.text for part in item.content] == [reasoning]
    assert [part.text for part in item.summary] == [reasoning]
    assert response.output_text == ""
    assert response.reasoning.effort == "low"
    assert without_ids(final) == without_ids(response)
    deltas = [event.delta for event in events if event.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == reasoning
    # A reasoning item sent back is the assistant turn's reasoning.
    follow_up = [*INPUT[:1], item.model_dump(exclude_none=True), INPUT[2]]
    assert create(client, input=follow_up, max_output_tokens=1).usage.input_tokens > 0


def test_previous_response_id_continues_the_conversation(
    server: RunningServer, client: Any
) -> None:
    first = create(client, input=INPUT[:1], max_output_tokens=6)
    second = create(client, input="Another one?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    # The instructions are not carried over; the first response's input and output are.
    conversation = [
        {"role": "system", "content": INSTRUCTIONS},
        INPUT[0],
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Another one?"},
    ]
    twin = chat(server, messages=conversation)
    assert second.usage.input_tokens == twin["usage"]["prompt_tokens"]
    assert second.output_text == twin["choices"][0]["message"]["content"]
    # A chain of three, streamed at the end.
    _, third = streamed(client, input="And one more?", previous_response_id=second.id)
    twin = chat(
        server,
        messages=[
            *conversation,
            {"role": "assistant", "content": second.output_text},
            {"role": "user", "content": "And one more?"},
        ],
    )
    assert third.usage.input_tokens == twin["usage"]["prompt_tokens"]
    # Not stored: not retrievable, not continuable.
    unstored = create(client, store=False)
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, previous_response_id=unstored.id)
    assert refused.value.body["param"] == "previous_response_id"


def test_get_and_delete_a_stored_response(server: RunningServer, client: Any) -> None:
    response = create(client)
    fetched = client.responses.retrieve(response.id)
    assert fetched.model_dump() == response.model_dump()
    raw = server.client.delete(f"/v1/responses/{response.id}")
    assert raw.status_code == 200
    assert raw.json() == {"id": response.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve(response.id)
    assert missing.value.body["type"] == "invalid_request_error"
    assert response.id in missing.value.body["message"]
    gone = server.client.delete(f"/v1/responses/{response.id}")
    assert gone.status_code == 404
    assert set(gone.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.BadRequestError):
        create(client, previous_response_id=response.id)


def test_the_store_is_bounded(server: RunningServer, client: Any) -> None:
    store = server.state.response_store
    saved = store.capacity
    store.capacity = 2
    try:
        ids = [create(client, max_output_tokens=1).id for _ in range(3)]
        assert len(store) == 2
        assert server.client.get(f"/v1/responses/{ids[0]}").status_code == 404
        assert server.client.get(f"/v1/responses/{ids[2]}").status_code == 200
    finally:
        store.capacity = saved


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": None}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0].image_url",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
            "input[0].call_id",
        ),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": TOOLS}, "tool_choice"),  # auto needs --tool-call-parser
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"metadata": {"k": 1}}, "metadata.k"),
    ],
)
def test_bad_requests_name_the_field(
    server: RunningServer, fields: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "input": INPUT, "max_output_tokens": 10, **fields}
    response = server.client.post("/v1/responses", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert error["message"].startswith(f"{param}:"), error


def test_unknown_ids_are_404s(server: RunningServer) -> None:
    for method in ("GET", "DELETE"):
        response = server.client.request(method, "/v1/responses/resp_nope")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


def test_a_failure_mid_stream_is_a_numbered_error_event(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_step() -> Any:
        raise RuntimeError("injected engine failure")

    monkeypatch.setattr(server.engine.core, "step", failing_step)
    body = {"model": MODEL, "input": INPUT, "max_output_tokens": 4, "stream": True}
    response = server.client.post("/v1/responses", json=body)
    monkeypatch.undo()
    assert response.status_code == 200
    frames = response.content.decode().split("\n\n")
    assert frames[-1] == ""  # no [DONE]: the Responses API ends on its last event
    name, data = frames[-2].split("\n")
    assert name == "event: error"
    error = json.loads(data.removeprefix("data: "))
    previous = json.loads(frames[-3].split("\n")[1].removeprefix("data: "))
    assert error["sequence_number"] == previous["sequence_number"] + 1
    assert error["code"] == "internal_error"
    assert "injected" not in error["message"]
    server.wait_idle()
