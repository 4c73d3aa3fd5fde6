"""``JsonScanner`` against Python's JSON reader: where values end, what it accepts, the spans
of an object's members, and the same answers for any split of the text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_server.parsers.json_scan import JsonScanner

from .conftest import deltas

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def documents(draw: st.DrawFn, values: st.SearchStrategy[Any] = json_values) -> tuple[Any, str]:
    value = draw(values)
    indent = draw(st.sampled_from([None, 0, 2]))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")]))
    ensure_ascii = draw(st.booleans())
    return value, json.dumps(value, indent=indent, separators=separators, ensure_ascii=ensure_ascii)


def scan(pieces: list[str], start: int = 0) -> JsonScanner:
    scanner = JsonScanner(start)
    text = ""
    for number, piece in enumerate(pieces):
        text += piece
        scanner.advance(text, is_final=number == len(pieces) - 1)
    return scanner


def reject_constant(name: str) -> None:
    raise ValueError(name)


def json_accepts(text: str) -> bool:
    try:
        json.loads(text, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        return False
    return True


def summary(scanner: JsonScanner) -> tuple[object, ...]:
    members = [(m.key, m.key_start, m.value_start, m.value_end) for m in scanner.members]
    return scanner.end, scanner.failed_at, members


@settings(max_examples=300, deadline=None, database=None)
@given(document=documents(), trailing=st.sampled_from(["", " ", "\n</tool_call>", ",", "]"]))
def test_a_value_ends_where_json_says(document: tuple[Any, str], trailing: str) -> None:
    _, text = document
    scanner = scan([text + trailing])
    assert (scanner.end, scanner.failed_at) == (len(text), None)


@settings(max_examples=300, deadline=None, database=None)
@given(document=documents(st.dictionaries(st.text(max_size=5), json_values, max_size=5)))
def test_members_of_an_object(document: tuple[dict[str, Any], str]) -> None:
    value, text = document
    scanner = scan([text])
    assert [member.key for member in scanner.members] == list(value)
    for member in scanner.members:
        assert json.JSONDecoder().raw_decode(text, member.key_start)[0] == member.key
        assert member.value_start is not None
        assert member.value_end is not None
        assert json.loads(text[member.value_start : member.value_end]) == value[member.key]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A JSON document with a few characters inserted, deleted or replaced."""
    _, text = draw(documents())
    for _ in range(draw(st.integers(0, 3))):
        position = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["insert", "delete", "replace"]))
        char = draw(st.sampled_from(list('{}[]",:\\/0123456789.-+eEtrufalsn \n\t\x01u')))
        if kind == "insert":
            text = text[:position] + char + text[position:]
        elif kind == "delete":
            text = text[:position] + text[position + 1 :]
        else:
            text = text[:position] + char + text[position + 1 :]
    return text


@settings(max_examples=1000, deadline=None, database=None)
@given(text=mutated())
def test_it_accepts_what_json_accepts(text: str) -> None:
    stripped = text.lstrip(" \t\r\n")
    offset = len(text) - len(stripped)
    if not stripped:
        return
    scanner = scan([text], start=offset)
    accepted = scanner.end is not None and not text[scanner.end :].strip(" \t\r\n")
    assert accepted == json_accepts(text)
    if scanner.end is None:
        assert scanner.failed_at is not None


@settings(max_examples=500, deadline=None, database=None)
@given(data=st.data(), text=mutated())
def test_any_split_gives_the_same_answers(data: st.DataObject, text: str) -> None:
    if not text or text[0] in " \t\r\n":
        return
    assert summary(scan(data.draw(deltas(text)))) == summary(scan([text]))


@pytest.mark.parametrize(
    ("text", "failed_at"),
    [
        ('{"a" 1}', 5),
        ('{"a": 1]', 7),
        ('{"a": tru}', 6),
        ('{"a": "x\ny"}', 8),
        ('{"a": "\\x"}', 7),
        ('{"a": NaN}', 6),
        ("[1, 2,]", 6),
        ('{"a": 1', 7),
        ('"open', 5),
    ],
)
def test_where_it_stops_being_json(text: str, failed_at: int) -> None:
    scanner = scan([text])
    assert (scanner.end, scanner.failed_at) == (None, failed_at)


@pytest.mark.parametrize("text", ['{"a": 12', '{"a": "\\u00', '{"a": "\\', '{"a": tr', "-"])
def test_it_waits_for_what_may_still_grow(text: str) -> None:
    scanner = JsonScanner(0)
    scanner.advance(text, is_final=False)
    assert not scanner.is_settled


def test_it_reads_only_what_was_added() -> None:
    """A long string is followed in linear time: each advance resumes where the last stopped."""
    scanner = JsonScanner(0)
    text = '{"code": "'
    for _ in range(20_000):
        text += "x\\n"
        scanner.advance(text, is_final=False)
    scanner.advance(text + '"}', is_final=True)
    assert scanner.end == len(text) + 2
