"""Tool-call parsers on outputs written in each model family's documented format: read whole,
and streamed in deltas of every size, whose pieces must add up to the whole reading."""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_server.parsers import (
    REQUIRED_CALLS_PARSER,
    TOOL_CALL_PARSER_NAMES,
    TOOL_CALL_PARSERS,
    ParsedToolCalls,
    ToolCall,
    make_tool_call_parser,
)

from .conftest import cut, deltas, is_subsequence, stream

WEATHER = '{"city": "Paris", "unit": "celsius"}'
# Braces and brackets in strings, escaped quotes and backslashes, escapes, markers of every
# format inside a string, unicode, nesting, every kind of JSON value.
TRICKY = (
    r'{"query": "a } b { \" c ] [", "nested": {"list": [1, {"x": "]"}], "none": null, '
    r'"ok": true, "n": -1.5e3, "empty": {}}, "emoji": "日本 🌧", '
    r'"escapes": "\\ \n \u00e9 </tool_call> [TOOL_CALLS] ; {\"name\": 1}"}'
)


def glm_arguments(**pairs: object) -> str:
    return json.dumps(pairs, ensure_ascii=False)


@attrs.frozen
class Recorded:
    parser: str
    text: str
    content: str | None
    calls: tuple[tuple[str, str], ...] = ()
    # A call found malformed only after its name could be streamed: a stream may have
    # announced it, so the streamed calls hold the whole reading's calls and maybe that one.
    breaks_late: bool = False

    def expected(self) -> ParsedToolCalls:
        return ParsedToolCalls(
            content=self.content, calls=tuple(ToolCall(name=n, arguments=a) for n, a in self.calls)
        )


def hermes_call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


RECORDED: dict[str, Recorded] = {
    # hermes (Qwen2.5/Qwen3, Hermes)
    "hermes-content-then-call": Recorded(
        "hermes",
        f"I will check the weather.\n\n{hermes_call('get_weather', WEATHER)}",
        "I will check the weather.",
        (("get_weather", WEATHER),),
    ),
    "hermes-two-calls": Recorded(
        "hermes",
        f"{hermes_call('search', TRICKY)}\n{hermes_call('get_weather', WEATHER)}",
        None,
        (("search", TRICKY), ("get_weather", WEATHER)),
    ),
    "hermes-content-between-and-after": Recorded(
        "hermes",
        f"Checking both.\n{hermes_call('get_time', '{}')}\nAnd the weather:\n"
        f"{hermes_call('get_weather', WEATHER)}\nDone.  ",
        "Checking both.\nAnd the weather:\nDone.",
        (("get_time", "{}"), ("get_weather", WEATHER)),
    ),
    "hermes-no-call-is-unchanged": Recorded(
        "hermes",
        "  No tools needed: 2 < 3, <b>bold</b>, a {brace}.\n\n",
        "  No tools needed: 2 < 3, <b>bold</b>, a {brace}.\n\n",
    ),
    "hermes-unclosed-at-the-end": Recorded(
        "hermes",
        f'<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}',
        None,
        (("get_weather", WEATHER),),
    ),
    "hermes-broken-json": Recorded(
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
        breaks_late=True,
    ),
    "hermes-broken-then-good": Recorded(
        "hermes",
        f"<tool_call>\nnot json\n</tool_call>\n{hermes_call('get_weather', WEATHER)}",
        "<tool_call>\nnot json\n</tool_call>",
        (("get_weather", WEATHER),),
    ),
    "hermes-arguments-before-name": Recorded(
        "hermes",
        '<tool_call>\n{"arguments": {"a": [1, 2]}, "name": "f"}\n</tool_call>',
        None,
        (("f", '{"a": [1, 2]}'),),
    ),
    "hermes-no-arguments": Recorded(
        "hermes", '<tool_call>\n{"name": "get_time"}\n</tool_call>', None, (("get_time", "{}"),)
    ),
    "hermes-arguments-not-an-object": Recorded(
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>',
    ),
    "hermes-raw-newline-in-a-string": Recorded(
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": {"text": "line\nbreak"}}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": {"text": "line\nbreak"}}\n</tool_call>',
        breaks_late=True,
    ),
    "hermes-text-after-the-object": Recorded(
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": {}} oops\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": {}} oops\n</tool_call>',
        breaks_late=True,
    ),
    "hermes-empty-name": Recorded(
        "hermes",
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',
    ),
    "hermes-empty": Recorded("hermes", "", None),
    "hermes-whitespace-only": Recorded("hermes", " \n\t ", None),
    "hermes-cut-inside-the-tag": Recorded("hermes", "Sure <tool_", "Sure <tool_"),
    "hermes-tag-at-the-end": Recorded("hermes", "Sure<tool_call>", "Sure<tool_call>"),
    # llama3_json (Llama 3.1/3.2)
    "llama3-one-call": Recorded(
        "llama3_json",
        f'{{"name": "get_weather", "parameters": {WEATHER}}}',
        None,
        (("get_weather", WEATHER),),
    ),
    "llama3-python-tag-two-calls": Recorded(
        "llama3_json",
        f'<|python_tag|>{{"name": "search", "parameters": {TRICKY}}}; '
        f'{{"name": "get_weather", "parameters": {WEATHER}}}',
        None,
        (("search", TRICKY), ("get_weather", WEATHER)),
    ),
    "llama3-arguments-key-after-newlines": Recorded(
        "llama3_json",
        f'\n\n{{"name": "get_weather", "arguments": {WEATHER}}}',
        None,
        (("get_weather", WEATHER),),
    ),
    "llama3-plain-text": Recorded(
        "llama3_json", "The weather is fine {or so}.", "The weather is fine {or so}."
    ),
    "llama3-unclosed": Recorded(
        "llama3_json",
        '{"name": "f", "parameters": {"a": 1}',
        '{"name": "f", "parameters": {"a": 1}',
        breaks_late=True,
    ),
    "llama3-json-that-is-not-a-call": Recorded(
        "llama3_json", '{"answer": 42, "unit": "°C"}', '{"answer": 42, "unit": "°C"}'
    ),
    "llama3-call-then-text": Recorded(
        "llama3_json",
        '{"name": "f", "parameters": {"a": 1}}\n\nHope that helps.',
        "Hope that helps.",
        (("f", '{"a": 1}'),),
    ),
    "llama3-python-tag-then-code": Recorded(
        "llama3_json", '<|python_tag|>print("hi")', '<|python_tag|>print("hi")'
    ),
    "llama3-both-argument-keys": Recorded(
        "llama3_json",
        '{"name": "f", "arguments": {}, "parameters": {}}',
        '{"name": "f", "arguments": {}, "parameters": {}}',
        breaks_late=True,
    ),
    "llama3-second-call-broken": Recorded(
        "llama3_json",
        '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"x": }',
        '; {"name": "g", "parameters": {"x": }',
        (("f", "{}"),),
        breaks_late=True,
    ),
    # mistral, by tokenizer version
    "mistral-v3-array-after-content": Recorded(
        "mistral",
        f'Let me look.[TOOL_CALLS][{{"name": "get_weather", "arguments": {WEATHER}, '
        f'"id": "abcDEF123"}}, {{"name": "search", "arguments": {TRICKY}, "id": "xyzXYZ789"}}]',
        "Let me look.",
        (("get_weather", WEATHER), ("search", TRICKY)),
    ),
    "mistral-v3-space-before-array": Recorded(
        "mistral",
        f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {WEATHER}}}]',
        None,
        (("get_weather", WEATHER),),
    ),
    "mistral-v11-call-ids": Recorded(
        "mistral",
        '[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{"city": "Zürich"}'
        '[TOOL_CALLS]get_weather[CALL_ID]xyzXYZ789[ARGS]{"city": "Bern"}',
        None,
        (("get_weather", '{"city": "Zürich"}'), ("get_weather", '{"city": "Bern"}')),
    ),
    "mistral-v13-after-content": Recorded(
        "mistral",
        'I should call the tools.[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich", "unit": "c"}'
        f"[TOOL_CALLS]search[ARGS]{TRICKY}",
        "I should call the tools.",
        (("get_weather", '{"city": "Zürich", "unit": "c"}'), ("search", TRICKY)),
    ),
    "mistral-without-args-marker": Recorded(
        "mistral",
        '[TOOL_CALLS]get_weather{"city": "Paris"}',
        None,
        (("get_weather", '{"city": "Paris"}'),),
    ),
    "mistral-broken-array": Recorded("mistral", "[TOOL_CALLS][{oops", "[TOOL_CALLS][{oops"),
    "mistral-empty-array": Recorded("mistral", "[TOOL_CALLS][]", "[TOOL_CALLS][]"),
    "mistral-cut-inside-the-marker": Recorded("mistral", "Almost [TOOL_CA", "Almost [TOOL_CA"),
    "mistral-marker-at-the-end": Recorded("mistral", "Sure.[TOOL_CALLS]", "Sure.[TOOL_CALLS]"),
    "mistral-bad-name": Recorded(
        "mistral", "[TOOL_CALLS]get weather[ARGS]{}", "[TOOL_CALLS]get weather[ARGS]{}"
    ),
    "mistral-text-after-the-calls": Recorded(
        "mistral",
        "[TOOL_CALLS]get_time[ARGS]{}\n\nI called it.",
        "I called it.",
        (("get_time", "{}"),),
    ),
    "mistral-array-good-then-broken": Recorded(
        "mistral",
        '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"x": tru}]',
        ', {"name": "g", "arguments": {"x": tru}]',
        (("f", "{}"),),
        breaks_late=True,
    ),
    "mistral-broken-then-good": Recorded(
        "mistral",
        "[TOOL_CALLS]get_time[ARGS]nope [TOOL_CALLS]get_time[ARGS]{}",
        "[TOOL_CALLS]get_time[ARGS]nope",
        (("get_time", "{}"),),
    ),
    # glm45 (GLM-4.5/4.6 with newlines, GLM-4.7/5 without)
    "glm45-content-then-call": Recorded(
        "glm45",
        "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        "Checking.",
        (("get_weather", glm_arguments(city="Paris", days=3)),),
    ),
    "glm5-compact-two-calls": Recorded(
        "glm45",
        "<tool_call>get_time</tool_call><tool_call>get_weather<arg_key>city</arg_key>"
        "<arg_value>東京</arg_value></tool_call>",
        None,
        (("get_time", "{}"), ("get_weather", glm_arguments(city="東京"))),
    ),
    "glm45-value-types": Recorded(
        "glm45",
        "<tool_call>configure\n"
        '<arg_key>tags</arg_key>\n<arg_value>["a", "b"]</arg_value>\n'
        '<arg_key>options</arg_key>\n<arg_value>{"deep": {"x": null}}</arg_value>\n'
        "<arg_key> flag </arg_key>\n<arg_value>true</arg_value>\n"
        '<arg_key>quoted</arg_key>\n<arg_value>"42"</arg_value>\n'
        "<arg_key>spaced</arg_key>\n<arg_value> 7 </arg_value>\n"
        "<arg_key>nan</arg_key>\n<arg_value>NaN</arg_value>\n"
        "<arg_key>huge</arg_key>\n<arg_value>1e999</arg_value>\n"
        "<arg_key>almost</arg_key>\n<arg_value>123abc</arg_value>\n"
        "<arg_key>empty</arg_key>\n<arg_value></arg_value>\n"
        "<arg_key>nothing</arg_key>\n<arg_value>null</arg_value>\n</tool_call>",
        None,
        (
            (
                "configure",
                glm_arguments(
                    tags=["a", "b"],
                    options={"deep": {"x": None}},
                    flag=True,
                    quoted="42",
                    spaced=7,
                    nan="NaN",
                    huge="1e999",
                    almost="123abc",
                    empty="",
                    nothing=None,
                ),
            ),
        ),
    ),
    "glm45-code-value": Recorded(
        "glm45",
        "<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>a.py</arg_value>\n"
        '<arg_key>content</arg_key>\n<arg_value>def f():\n    return "</tool_call>" < 1\n'
        "</arg_value>\n</tool_call>",
        None,
        (
            (
                "write_file",
                glm_arguments(path="a.py", content='def f():\n    return "</tool_call>" < 1\n'),
            ),
        ),
    ),
    "glm45-mismatched-tags": Recorded(
        "glm45",
        "<tool_call>get_weather\n<arg_key>city</arg_value>\n</tool_call>",
        "<tool_call>get_weather\n<arg_key>city</arg_value>\n</tool_call>",
        breaks_late=True,
    ),
    "glm45-unclosed-at-the-end": Recorded(
        "glm45",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n",
        None,
        (("get_weather", glm_arguments(city="Paris")),),
    ),
    "glm45-bad-name": Recorded(
        "glm45", '<tool_call>"get_weather"\n</tool_call>', '<tool_call>"get_weather"\n</tool_call>'
    ),
    "glm45-key-twice": Recorded(
        "glm45",
        "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n"
        "<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
        None,
        (("f", '{"a": 1, "a": 2}'),),
    ),
    "glm45-no-call": Recorded("glm45", "a < b and <tool> tags", "a < b and <tool> tags"),
    # openai_required (the grammar of tool_choice "required")
    "required-two-calls": Recorded(
        REQUIRED_CALLS_PARSER,
        f'[{{"name": "get_weather", "parameters": {WEATHER}}}, '
        f'{{"name": "search", "parameters": {TRICKY}}}]',
        None,
        (("get_weather", WEATHER), ("search", TRICKY)),
    ),
    "required-pretty-printed": Recorded(
        REQUIRED_CALLS_PARSER,
        '[\n  {\n    "name": "get_time",\n    "parameters": {}\n  }\n]\n',
        None,
        (("get_time", "{}"),),
    ),
    "required-cut-in-the-first-call": Recorded(
        REQUIRED_CALLS_PARSER,
        '[{"name": "get_weather", "parameters": {"city": "Pa',
        '[{"name": "get_weather", "parameters": {"city": "Pa',
        breaks_late=True,
    ),
    "required-cut-in-the-second-call": Recorded(
        REQUIRED_CALLS_PARSER,
        '[{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {"ci',
        ', {"name": "get_weather", "parameters": {"ci',
        (("get_time", "{}"),),
        breaks_late=True,
    ),
    "required-not-an-array": Recorded(
        REQUIRED_CALLS_PARSER, "I cannot call tools.", "I cannot call tools."
    ),
    "required-empty-array": Recorded(REQUIRED_CALLS_PARSER, "[]", "[]"),
}


def test_the_tricky_arguments_are_json() -> None:
    assert json.loads(TRICKY)["escapes"].startswith("\\ \n é </tool_call>")


@pytest.mark.parametrize("case", RECORDED.values(), ids=RECORDED.keys())
def test_whole_outputs(case: Recorded) -> None:
    parsed = make_tool_call_parser(case.parser).parse(case.text)
    assert parsed == case.expected()
    for call in parsed.calls:
        assert isinstance(json.loads(call.arguments), dict)


@pytest.mark.parametrize("case", RECORDED.values(), ids=RECORDED.keys())
def test_one_final_delta_streams_exactly_the_whole_reading(case: Recorded) -> None:
    """Even a call that breaks late: seen whole, it is known malformed before it is sent."""
    streamed = stream(case.parser, [case.text])
    assert (streamed.content or None, streamed.calls) == (case.content, case.expected().calls)


@pytest.mark.parametrize("case", RECORDED.values(), ids=RECORDED.keys())
def test_character_by_character(case: Recorded) -> None:
    check_stream(case, list(case.text))


@settings(max_examples=40, deadline=None, database=None)
@given(data=st.data())
@pytest.mark.parametrize("case", RECORDED.values(), ids=RECORDED.keys())
def test_any_split_adds_up_to_the_whole(case: Recorded, data: st.DataObject) -> None:
    check_stream(case, data.draw(deltas(case.text)))


def check_stream(case: Recorded, pieces: list[str]) -> None:
    streamed = stream(case.parser, pieces)
    expected = case.expected()
    assert streamed.content == (expected.content or "")
    if case.breaks_late:
        assert is_subsequence(expected.calls, streamed.calls)
        assert len(streamed.calls) <= len(expected.calls) + 1
    else:
        assert streamed.calls == expected.calls


# Outputs of one call each, and where its arguments' span starts.
STREAMED_ARGUMENTS = {
    "hermes": hermes_call("search", TRICKY),
    "llama3_json": f'<|python_tag|>{{"name": "search", "parameters": {TRICKY}}}',
    "mistral-v3": f'[TOOL_CALLS][{{"name": "search", "arguments": {TRICKY}}}]',
    "mistral-v13": f"[TOOL_CALLS]search[ARGS]{TRICKY}",
    "required": f'[{{"name": "search", "parameters": {TRICKY}}}]',
}
PARSER_OF = {"mistral-v3": "mistral", "mistral-v13": "mistral", "required": REQUIRED_CALLS_PARSER}


@pytest.mark.parametrize("case", STREAMED_ARGUMENTS)
def test_arguments_stream_as_they_are_written(case: str) -> None:
    """The name comes with the arguments' first character, and from then on every character
    of the arguments is sent as soon as it is fed."""
    text = STREAMED_ARGUMENTS[case]
    parser = make_tool_call_parser(PARSER_OF.get(case, case))
    start = text.index(TRICKY)
    sent = ""
    for position, char in enumerate(text):
        delta = parser.feed(char, is_final=False)
        assert delta.content == ""
        if position < start:
            assert delta.calls == ()
            continue
        [call] = delta.calls
        assert call.name == ("search" if position == start else None)
        sent += call.arguments
        assert sent == TRICKY[: position - start + 1]
        if sent == TRICKY:
            break


def test_glm_string_values_stream_as_they_are_written() -> None:
    code = 'def f():\n    return "}" < 1\n'
    text = (
        "<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>"
        f"{code}</arg_value>\n</tool_call>"
    )
    parser = make_tool_call_parser("glm45")
    start = text.index(code)
    sent = ""
    for position, char in enumerate(text[: start + len(code)]):
        sent += "".join(call.arguments for call in parser.feed(char, is_final=False).calls)
        if position >= start:
            written = code[: position - start + 1]
            # "<" may start </arg_value>: it waits for the next character.
            shown = written[:-1] if written.endswith("<") else written
            assert sent == '{"content": ' + json.dumps(shown, ensure_ascii=False)[:-1]
    final = parser.feed(text[start + len(code) :], is_final=True)
    sent += "".join(call.arguments for call in final.calls)
    assert sent == glm_arguments(content=code)


def test_glm_json_values_wait_for_their_closing_tag() -> None:
    parser = make_tool_call_parser("glm45")
    first = parser.feed("<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>12", is_final=False)
    assert [(call.name, call.arguments) for call in first.calls] == [("f", "")]
    rest = parser.feed("3</arg_value>\n</tool_call>", is_final=True)
    assert [(call.name, call.arguments) for call in rest.calls] == [(None, '{"n": 123}')]


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        ("hermes", "Use a <b>tag</b>, [brackets] and {braces} <tool_call"),
        ("glm45", "Use a <b>tag</b>, [brackets] and {braces} <tool_call"),
        ("mistral", "Use a <b>tag</b>, [brackets] and {braces} [TOOL_CALLS"),
        ("llama3_json", "Use a <b>tag</b>, [brackets] and {braces} <|python_tag|>"),
        (REQUIRED_CALLS_PARSER, "Use a <b>tag</b>, [brackets] and {braces}"),
    ],
)
def test_content_is_sent_as_soon_as_it_is_known(parser: str, text: str) -> None:
    """Content waits only while it may be the start of a marker, and for trailing
    whitespace; never longer."""
    marker = "[TOOL_CALLS]" if parser == "mistral" else "<tool_call>"
    stream_parser = make_tool_call_parser(parser)
    sent = ""
    for position, char in enumerate(text):
        sent += stream_parser.feed(char, is_final=False).content
        so_far = text[: position + 1]
        held = max(n for n in range(len(marker)) if so_far.endswith(marker[:n]))
        if parser in ("hermes", "glm45", "mistral"):
            assert sent == so_far[: len(so_far) - held].rstrip()
        else:
            assert sent == so_far.rstrip()


@pytest.mark.parametrize(
    ("parser", "held"),
    [
        ("hermes", "<tool_"),
        ("glm45", "<tool_call"),
        ("mistral", "[TOOL_C"),
        ("llama3_json", "<|py"),
    ],
)
def test_a_partial_marker_never_leaks(parser: str, held: str) -> None:
    stream_parser = make_tool_call_parser(parser)
    sent = stream_parser.feed(held if parser == "llama3_json" else "Sure. " + held, is_final=False)
    assert sent.content == ("" if parser == "llama3_json" else "Sure.")
    assert stream_parser.feed("x", is_final=True).content == (
        held + "x" if parser == "llama3_json" else " " + held + "x"
    )


def test_whitespace_only_content_is_never_sent() -> None:
    parser = make_tool_call_parser("hermes")
    pieces = ["\n", "  ", hermes_call("get_time", "{}"), "\n\n", " "]
    streamed = stream(parser, pieces)
    assert streamed.content == ""
    assert make_tool_call_parser("hermes").parse("".join(pieces)).content is None


def test_parse_leaves_the_stream_alone() -> None:
    parser = make_tool_call_parser("hermes")
    first = parser.feed("Hi <tool_call>\n", is_final=False)
    assert parser.parse(hermes_call("f", "{}")).calls == (ToolCall(name="f", arguments="{}"),)
    rest = parser.feed('{"name": "g", "arguments": {}}</tool_call>', is_final=True)
    assert first.content == "Hi"
    assert [(call.name, call.arguments) for call in rest.calls] == [("g", "{}")]


def test_nothing_may_be_fed_after_the_final_delta() -> None:
    parser = make_tool_call_parser("mistral")
    parser.feed("done", is_final=True)
    with pytest.raises(ValueError, match="already ended"):
        parser.feed("", is_final=False)


def test_a_stream_keeps_a_call_broken_after_its_name_was_sent() -> None:
    """The documented exception: the name and arguments sent stay sent, the call's text
    comes as content, and the next call's index is one past it."""
    text = hermes_call("f", '{"a": 1') + "\n" + hermes_call("g", "{}")
    pieces = cut(text, [text.index('{"a"') + 3])
    streamed = stream("hermes", pieces)
    parsed = make_tool_call_parser("hermes").parse(text)
    assert parsed.calls == (ToolCall(name="g", arguments="{}"),)
    assert streamed.calls == (
        ToolCall(name="f", arguments='{"a'),
        ToolCall(name="g", arguments="{}"),
    )
    assert streamed.content == parsed.content == hermes_call("f", '{"a": 1')


def test_the_registry() -> None:
    assert TOOL_CALL_PARSER_NAMES == ("hermes", "llama3_json", "mistral", "glm45")
    assert tuple(TOOL_CALL_PARSERS) == TOOL_CALL_PARSER_NAMES
    assert REQUIRED_CALLS_PARSER not in TOOL_CALL_PARSERS
    for name in (*TOOL_CALL_PARSER_NAMES, REQUIRED_CALLS_PARSER):
        first, second = make_tool_call_parser(name), make_tool_call_parser(name)
        assert first is not second


@pytest.mark.parametrize("name", ["pythonic", "", "Hermes", "qwen3"])
def test_an_unknown_parser_names_the_choices(name: str) -> None:
    with pytest.raises(ValueError, match="choose one of hermes, llama3_json, mistral, glm45") as e:
        make_tool_call_parser(name)
    assert repr(name) in str(e.value)
