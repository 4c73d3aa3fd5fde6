"""``StructuredOutputsParams``: exactly one constraint, hashable as a cache key."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest

from metrale_server.structured import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"json": SCHEMA}, "json"),
        ({"json": '{"type": "string"}'}, "json"),
        ({"regex": "[0-9]+"}, "regex"),
        ({"choice": ["yes", "no"]}, "choice"),
        ({"grammar": 'start: "a"'}, "grammar"),
        ({"json_object": True}, "json_object"),
    ],
)
def test_each_kind_alone(fields: dict[str, Any], kind: str) -> None:
    assert StructuredOutputsParams(**fields).kind == kind


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"json_object": False},
        {"regex": "a", "json_object": True},
        {"json": SCHEMA, "choice": ["a"]},
        {"regex": "a", "grammar": 'start: "a"'},
    ],
)
def test_exactly_one_constraint(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(**fields)


@pytest.mark.parametrize("choice", [[], ["a", ""], ("a", 3)])
def test_choices_are_non_empty_strings(choice: Any) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StructuredOutputsParams(choice=choice)


def test_a_string_is_not_a_list_of_choices() -> None:
    with pytest.raises(ValueError, match="not one string"):
        StructuredOutputsParams(choice="yes")


def test_choice_becomes_a_tuple() -> None:
    assert StructuredOutputsParams(choice=["yes", "no"]).choice == ("yes", "no")


def compact(schema: dict[str, Any]) -> str:
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def test_a_schema_dict_is_kept_as_json_text_in_its_key_order() -> None:
    params = StructuredOutputsParams(json=SCHEMA)
    assert params.json == compact(SCHEMA)
    assert json.loads(params.json) == SCHEMA
    # Property order is output order: "b" stays before "a".
    assert params.json.index('"b"') < params.json.index('"a"')


def test_equal_constraints_are_one_cache_key() -> None:
    as_dict = StructuredOutputsParams(json=SCHEMA)
    as_text = StructuredOutputsParams(json=compact(SCHEMA))
    assert as_dict == as_text
    assert hash(as_dict) == hash(as_text)
    assert {as_dict: 1}[as_text] == 1
    assert StructuredOutputsParams(choice=["a", "b"]) == StructuredOutputsParams(choice=("a", "b"))
    assert StructuredOutputsParams(regex="a") != StructuredOutputsParams(grammar="a")


def test_frozen() -> None:
    params = StructuredOutputsParams(regex="a")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        params.regex = "b"  # type: ignore[misc]
