"""Structured outputs over HTTP on the tiny random Llama: whatever the random model prefers,
the grammar decides what it may write, so every output must match its constraint."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest

from .conftest import RunningServer

# Bounded, so that any token path the grammar allows ends within max_tokens.
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe a person."}]


def chat(server: RunningServer, **body: Any) -> Any:
    response = server.client.post(
        "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 96, **body}
    )
    assert response.status_code == 200, response.text
    return response.json()


def chat_text(server: RunningServer, **body: Any) -> str:
    choice = chat(server, **body)["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    text: str = choice["message"]["content"]
    return text


def refusal(server: RunningServer, path: str = "/v1/chat/completions", **body: Any) -> Any:
    request = {"messages": MESSAGES, "max_tokens": 8, **body}
    if path == "/v1/completions":
        request = {"prompt": "Hello", "max_tokens": 8, **body}
    response = server.client.post(path, json=request)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


@pytest.mark.parametrize("seed", range(5))
def test_json_schema_response_validates(server: RunningServer, seed: int) -> None:
    text = chat_text(
        server,
        seed=seed,
        temperature=1.0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True},
        },
    )
    jsonschema.validate(json.loads(text), PERSON_SCHEMA)


def test_every_spelling_of_a_json_schema_constrains(server: RunningServer) -> None:
    for body in (
        {"structured_outputs": {"json": PERSON_SCHEMA}},
        {"guided_json": PERSON_SCHEMA},
        {"guided_json": json.dumps(PERSON_SCHEMA)},
    ):
        text = chat_text(server, seed=7, temperature=1.0, **body)
        jsonschema.validate(json.loads(text), PERSON_SCHEMA)


def test_json_object_starts_an_object(server: RunningServer) -> None:
    choice = chat(server, seed=3, temperature=0.7, response_format={"type": "json_object"})[
        "choices"
    ][0]
    text = choice["message"]["content"]
    assert text.lstrip().startswith("{")
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict)


def test_json_object_cut_short_says_so(server: RunningServer) -> None:
    # The grammar bounds what is written, not how long: max_tokens cuts an object mid-way.
    choices = chat(
        server, n=8, seed=5, temperature=1.0, max_tokens=3, response_format={"type": "json_object"}
    )["choices"]
    for choice in choices:
        text = choice["message"]["content"]
        if choice["finish_reason"] == "length":
            with pytest.raises(json.JSONDecodeError):
                json.loads(text)
        else:
            assert choice["finish_reason"] == "stop", choice
            assert isinstance(json.loads(text), dict)
    assert any(choice["finish_reason"] == "length" for choice in choices)
    # A stop string still applies to constrained text, and ends it with finish_reason stop.
    [cut] = chat(server, seed=5, stop=["{"], response_format={"type": "json_object"})["choices"]
    assert (cut["finish_reason"], cut["stop_reason"]) == ("stop", "{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut["message"]["content"])


@pytest.mark.parametrize("seed", range(3))
def test_regex_and_choice_match(server: RunningServer, seed: int) -> None:
    pattern = r"[0-9]{3}-[0-9]{4}"
    for body in ({"structured_outputs": {"regex": pattern}}, {"guided_regex": pattern}):
        assert re.fullmatch(pattern, chat_text(server, seed=seed, **body))
    choices = ["red", "green", "blue"]
    for body in ({"structured_outputs": {"choice": choices}}, {"guided_choice": choices}):
        assert chat_text(server, seed=seed, **body) in choices


def test_completions_take_structured_outputs(server: RunningServer) -> None:
    response = server.client.post(
        "/v1/completions",
        json={
            "prompt": ["Phone:", "Call"],
            "n": 2,
            "seed": 1,
            "max_tokens": 16,
            "structured_outputs": {"regex": r"[0-9]{3}-[0-9]{4}"},
        },
    )
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert len(choices) == 4
    for choice in choices:
        assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", choice["text"]), choice


def test_streamed_structured_output_equals_whole(server: RunningServer) -> None:
    body = {
        "messages": MESSAGES,
        "max_tokens": 96,
        "seed": 11,
        "structured_outputs": {"json": PERSON_SCHEMA},
    }
    whole = server.client.post("/v1/chat/completions", json=body).json()
    raw = server.client.post("/v1/chat/completions", json={**body, "stream": True}).content
    streamed = "".join(
        event["choices"][0]["delta"].get("content", "")
        for event in server.parse_sse(raw)
        if event["choices"]
    )
    assert streamed == whole["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"use_beam_search": True}, "use_beam_search"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, None),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}},
            "response_format.json_schema.schema",
        ),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, None),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"guided_json": {"type": "nonsense-type"}}, "guided_json"),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
        ({"guided_json": {}, "response_format": {"type": "json_object"}}, None),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
    ],
)
def test_bad_constraints_are_400s_naming_the_field(
    server: RunningServer, body: dict[str, Any], param: str | None
) -> None:
    error = refusal(server, **body)
    if param is not None:
        assert error["param"] == param, error
    assert error["param"] is not None
    server.wait_idle()


def test_completions_refuse_unknown_fields(server: RunningServer) -> None:
    error = refusal(server, "/v1/completions", truncate_prompt_tokens=2)
    assert error["param"] == "truncate_prompt_tokens"
    assert "not supported" in error["message"]
    # null is "not set", and ``user`` is informational.
    response = server.client.post(
        "/v1/completions",
        json={"prompt": "Hi", "max_tokens": 2, "truncate_prompt_tokens": None, "user": "u-1"},
    )
    assert response.status_code == 200, response.text


def test_a_refused_grammar_changes_nothing(server: RunningServer) -> None:
    refusal(server, guided_regex="(unclosed")
    server.wait_idle()
    assert re.fullmatch(r"[0-9]{3}", chat_text(server, guided_regex=r"[0-9]{3}"))


def test_tokenize_renders_tools_and_refuses_unknown_fields(server: RunningServer) -> None:
    tools = [{"type": "function", "function": {"name": "get_time"}}]
    plain = server.client.post("/tokenize", json={"messages": MESSAGES})
    assert plain.status_code == 200, plain.text
    with_tools = server.client.post("/tokenize", json={"messages": MESSAGES, "tools": tools})
    assert with_tools.status_code == 200, with_tools.text
    response = server.client.post("/tokenize", json={"prompt": "Hi", "add_bos": True})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "add_bos"
    response = server.client.post("/detokenize", json={"tokens": [1], "skip": 1})
    assert response.json()["error"]["param"] == "skip"
