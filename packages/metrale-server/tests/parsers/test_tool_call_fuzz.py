"""Tool-call parsers on random outputs built from each format's pieces, well-formed and not:
they never raise, and the stream agrees with the whole reading for any split into deltas."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_server.parsers import REQUIRED_CALLS_PARSER, make_tool_call_parser

from .conftest import deltas, is_subsequence, stream

ARGUMENTS = ['{"a": 1}', '{"s": "} ] \\" <tool_call>"}', "{}", '{"x": [1, {"y": null}]}']
CALL_OBJECTS = [
    *(f'{{"name": "f", "arguments": {a}}}' for a in ARGUMENTS),
    '{"name": "g", "parameters": {"b": true}}',
    '{"arguments": {}, "name": "h"}',
    '{"name": "k"}',
]
JSON_PIECES = [
    *CALL_OBJECTS,
    '{"name": "f", "arguments": ',
    '{"name": ',
    '"f"',
    '"arguments": ',
    '{"a": ',
    "1",
    "tru",
    "}",
    "{",
    "]",
    "[",
    ",",
    ", ",
    ":",
    '"',
    "\\",
    "\\u00e9",
]
TEXT_PIECES = ["Hello", " ", "\n", "  \n", "日本", "🌧", "<", ">", "a", "<b>", "x\ty"]

FRAGMENTS = {
    "hermes": [
        *JSON_PIECES,
        *TEXT_PIECES,
        "<tool_call>",
        "</tool_call>",
        "<tool_",
        "</tool_",
        *(f"<tool_call>\n{call}\n</tool_call>" for call in CALL_OBJECTS),
    ],
    "llama3_json": [*JSON_PIECES, *TEXT_PIECES, "<|python_tag|>", "<|python", ";", "; "],
    "mistral": [
        *JSON_PIECES,
        *TEXT_PIECES,
        "[TOOL_CALLS]",
        "[TOOL_CA",
        "[ARGS]",
        "[CALL_ID]",
        "abcDEF123",
        "get_weather",
        "f",
        *(f"[TOOL_CALLS]get_weather[ARGS]{a}" for a in ARGUMENTS),
        f"[TOOL_CALLS][{CALL_OBJECTS[0]}, {CALL_OBJECTS[4]}]",
    ],
    "glm45": [
        *TEXT_PIECES,
        "<tool_call>",
        "</tool_call>",
        "get_weather",
        "f",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "city",
        "Paris",
        "3",
        '{"a": [1]}',
        "NaN",
        '"q"',
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
        "<tool_call>f<arg_key>n</arg_key><arg_value>[1, 2]</arg_value></tool_call>",
        "<tool_call>get_time\n</tool_call>",
    ],
    REQUIRED_CALLS_PARSER: [
        *JSON_PIECES,
        " ",
        "\n",
        "Hello",
        *(f"[{call}]" for call in CALL_OBJECTS),
        f"[{CALL_OBJECTS[0]}, {CALL_OBJECTS[4]}]",
    ],
}


@st.composite
def outputs(draw: st.DrawFn, parser: str) -> str:
    pieces = st.one_of(st.sampled_from(FRAGMENTS[parser]), st.text(max_size=3))
    return "".join(draw(st.lists(pieces, max_size=14)))


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data())
@pytest.mark.parametrize("parser", FRAGMENTS)
def test_random_outputs(parser: str, data: st.DataObject) -> None:
    text = data.draw(outputs(parser))
    parsed = make_tool_call_parser(parser).parse(text)
    for call in parsed.calls:
        assert call.name
        assert isinstance(json.loads(call.arguments), dict)
    if not parsed.calls:
        assert parsed.content == (text if text.strip() else None)
    if parsed.content is not None:
        assert parsed.content.strip()

    whole = stream(parser, [text])
    assert whole.content == (parsed.content or "")
    assert whole.calls == parsed.calls

    streamed = stream(parser, data.draw(deltas(text)))
    assert streamed.content == (parsed.content or "")
    # Equal but for calls found malformed after their names were streamed.
    assert is_subsequence(parsed.calls, streamed.calls)
