"""``GrammarCompiler``: each kind of constraint over the default model's vocabulary, the JSON
schema keywords it honours, its errors, its cache and its thread safety."""

from __future__ import annotations

import json
import threading
from typing import Any

import orjson
import pytest

from metrale_model_arch import Tokenizer
from metrale_server.structured import (
    GrammarCompiler,
    GrammarError,
    StructuredOutputsParams,
    allocate_bitmask,
    unpack_bitmask,
)

from .helpers import encode, is_complete_match, walk

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_a_schema_takes_json_dumps_layout_only(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    params = StructuredOutputsParams(json=PERSON)
    instance = {"name": "Ann", "age": 42}
    assert is_complete_match(compiler, default_tokenizer, params, json.dumps(instance))
    # No other whitespace: a model cannot loop on spaces or newlines inside the JSON.
    for layout in [
        json.dumps(instance, indent=2),
        json.dumps(instance, separators=(",", ":")),
        " " + json.dumps(instance),
        '{"name": "Ann",  "age": 42}',
    ]:
        assert not is_complete_match(compiler, default_tokenizer, params, layout), layout


@pytest.mark.parametrize(
    ("schema", "valid", "invalid"),
    [
        (
            {"type": "object", "properties": {"a": {"type": "integer"}}},
            ['{"a": 1}', "{}", '{"a": 1, "b": "extra"}'],
            ['{"a": "1"}'],
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "additionalProperties": False,
            },
            ['{"a": 1}', "{}"],
            ['{"a": 1, "b": "extra"}'],
        ),
        (
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            ['{"a": -3}'],
            ["{}"],
        ),
        ({"enum": ["red", "green", 3]}, ['"red"', '"green"', "3"], ['"blue"', "4"]),
        ({"const": "fixed"}, ['"fixed"'], ['"fixe"', '"fixedd"']),
        (
            {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            ["7", "null"],
            ['"7"', "true"],
        ),
        (
            {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
            ["[1]", "[1, 2]"],
            ["[]", "[1, 2, 3]"],
        ),
        ({"type": "string", "maxLength": 3}, ['"abc"', '""'], ['"abcd"']),
        ({"type": "string", "pattern": "^[0-9]{3}$"}, ['"123"'], ['"12"', '"12a"']),
        ({"type": "integer", "minimum": 1, "maximum": 12}, ["1", "12"], ["0", "13"]),
    ],
)
def test_json_schema_keywords(
    compiler: GrammarCompiler,
    default_tokenizer: Tokenizer,
    schema: dict[str, Any],
    valid: list[str],
    invalid: list[str],
) -> None:
    params = StructuredOutputsParams(json=schema)
    for text in valid:
        assert is_complete_match(compiler, default_tokenizer, params, text), text
    for text in invalid:
        assert not is_complete_match(compiler, default_tokenizer, params, text), text


def test_json_object_takes_any_object_only(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    params = StructuredOutputsParams(json_object=True)
    for text in ["{}", '{"a": [1, {"b": null}], "c": "d"}']:
        assert is_complete_match(compiler, default_tokenizer, params, text), text
    for text in ["[]", '"a"', "1"]:
        assert not is_complete_match(compiler, default_tokenizer, params, text), text


def test_the_schema_true_takes_any_json(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    params = StructuredOutputsParams(json="true")
    for text in ["{}", "[1, 2]", '"a"', "-1.5", "null"]:
        assert is_complete_match(compiler, default_tokenizer, params, text), text
    assert not is_complete_match(compiler, default_tokenizer, params, "nope")


@pytest.mark.parametrize(
    ("params", "valid", "invalid"),
    [
        (StructuredOutputsParams(regex=r"\d{3}-\d{4}"), ["555-0199"], ["555-019", "5550199"]),
        (
            StructuredOutputsParams(choice=("yes", "no", 'café "quoted"\n')),
            ["yes", "no", 'café "quoted"\n'],
            ["ye", "yesno", "maybe"],
        ),
        (StructuredOutputsParams(grammar='start: "ab" /[0-9]+/'), ["ab7", "ab42"], ["ab", "b7"]),
        (StructuredOutputsParams(grammar='?start: x\nx: "a" | "b"'), ["a", "b"], ["c"]),
        (
            StructuredOutputsParams(grammar='root ::= "ab" [0-9]+ ("x" | "y")*'),
            ["ab7", "ab42xyx"],
            ["ab", "abx"],
        ),
    ],
)
def test_regex_choice_lark_and_gbnf(
    compiler: GrammarCompiler,
    default_tokenizer: Tokenizer,
    params: StructuredOutputsParams,
    valid: list[str],
    invalid: list[str],
) -> None:
    for text in valid:
        walk(compiler, default_tokenizer, params, text)
        assert is_complete_match(compiler, default_tokenizer, params, text), text
    for text in invalid:
        assert not is_complete_match(compiler, default_tokenizer, params, text), text


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (StructuredOutputsParams(regex="(unclosed"), "invalid regex: .*unclosed group"),
        (StructuredOutputsParams(regex="a{2,1}"), "invalid regex: .*repetition"),
        (StructuredOutputsParams(json={"type": "nonsense"}), "invalid JSON schema: .*nonsense"),
        (StructuredOutputsParams(json="{not json"), "invalid JSON schema: not JSON"),
        (StructuredOutputsParams(json="[1, 2]"), "invalid JSON schema: a schema is an object"),
        (StructuredOutputsParams(json="false"), "invalid JSON schema: a schema is an object"),
        (
            StructuredOutputsParams(json={"type": "array", "uniqueItems": True}),
            "invalid JSON schema: .*uniqueItems",
        ),
        (
            StructuredOutputsParams(json={"type": "string", "pattern": "(?<=a)b"}),
            "invalid JSON schema: .*look-around",
        ),
        (StructuredOutputsParams(grammar="start: undefined_rule"), "invalid grammar: .*undefined"),
        (StructuredOutputsParams(grammar="root ::= missing"), "invalid grammar: GBNF: .*missing"),
        (StructuredOutputsParams(grammar="nonsense"), "invalid grammar"),
    ],
)
def test_bad_constraints_raise_grammar_error(
    compiler: GrammarCompiler, params: StructuredOutputsParams, message: str
) -> None:
    cached = compiler.num_cached
    with pytest.raises(GrammarError, match=message) as raised:
        compiler.compile(params)
    text = str(raised.value)
    assert "\n" not in text
    assert "^" not in text  # no caret lines
    assert compiler.num_cached == cached  # errors are not cached
    assert isinstance(raised.value, ValueError)


def test_compiled_once_then_from_the_cache(default_tokenizer: Tokenizer) -> None:
    compiler = GrammarCompiler(default_tokenizer, default_tokenizer.vocab_size)
    params = StructuredOutputsParams(json=PERSON)
    first = compiler.compile(params)
    assert compiler.compile(params) is first
    # The same schema as its compact JSON text is the same constraint.
    assert compiler.compile(StructuredOutputsParams(json=orjson.dumps(PERSON).decode())) is first
    assert (compiler.num_compiled, compiler.num_cache_hits) == (1, 2)
    assert compiler.compile_seconds == first.compile_seconds > 0


def test_the_least_recently_used_grammar_leaves_the_cache(default_tokenizer: Tokenizer) -> None:
    compiler = GrammarCompiler(default_tokenizer, default_tokenizer.vocab_size, cache_size=2)
    a, b, c = (StructuredOutputsParams(regex=r) for r in ("a+", "b+", "c+"))
    compiled_a = compiler.compile(a)
    compiler.compile(b)
    assert compiler.compile(a) is compiled_a  # a is now the most recently used
    compiler.compile(c)  # evicts b
    assert compiler.num_cached == 2
    assert compiler.compile(a) is compiled_a
    compiler.compile(b)
    assert compiler.num_compiled == 4


def test_compile_from_many_threads(default_tokenizer: Tokenizer) -> None:
    compiler = GrammarCompiler(default_tokenizer, default_tokenizer.vocab_size)
    shared = StructuredOutputsParams(json=PERSON)
    barrier = threading.Barrier(4)
    results: dict[int, list[Any]] = {}
    errors: list[BaseException] = []

    def compile_some(index: int) -> None:
        try:
            barrier.wait()
            own = StructuredOutputsParams(regex=f"x{{{index + 1}}}")
            results[index] = [compiler.compile(shared), compiler.compile(own)]
            for _ in range(20):
                matcher = compiler.compile(shared).matcher()
                assert all(map(matcher.accept_token, encode(default_tokenizer, '{"name": "')))
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=compile_some, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    # Every thread got the one cached grammar of the shared params, and its own grammar.
    assert len({id(result[0]) for result in results.values()}) == 1
    assert len({id(result[1]) for result in results.values()}) == 4
    assert compiler.num_cached == 5
    assert compiler.compile(shared) is results[0][0]


def test_logits_narrower_than_the_tokenizer_are_refused(default_tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        GrammarCompiler(default_tokenizer, default_tokenizer.vocab_size - 1)


def test_an_evicted_grammar_still_held_is_found_not_rebuilt(default_tokenizer: Tokenizer) -> None:
    # A request holds its grammar from the API's compile to the engine (and its matchers hold
    # it while it runs): the engine thread must find it even after the cache evicted it.
    compiler = GrammarCompiler(default_tokenizer, default_tokenizer.vocab_size, cache_size=1)
    held, other = (StructuredOutputsParams(regex=r) for r in ("a+", "b+"))
    compiled = compiler.compile(held)
    compiler.compile(other)  # evicts held from the cache
    assert compiler.compile(held) is compiled
    assert compiler.num_compiled == 2


def test_an_object_of_a_thousand_optional_properties_is_matched(
    default_tokenizer: Tokenizer,
) -> None:
    # ~4 Earley items a property: past llguidance's default bound of 2,000 items in a row, where
    # the mask allowed "{" and consuming it failed (the grammar refused what its mask allowed).
    # Properties come in the order of the schema.
    schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(1000)},
        "additionalProperties": False,
    }
    matcher = (
        GrammarCompiler(default_tokenizer, default_tokenizer.vocab_size)
        .compile(StructuredOutputsParams(json=json.dumps(schema)))
        .matcher()
    )
    bitmask = allocate_bitmask(1, default_tokenizer.vocab_size)
    for token_id in encode(default_tokenizer, '{"p3": 1, "p999": 7}'):
        matcher.fill_bitmask(bitmask, 0)
        assert unpack_bitmask(bitmask, default_tokenizer.vocab_size)[0, token_id]
        assert matcher.accept_token(token_id), matcher.error
    assert matcher.error is None
    assert matcher.is_stop_allowed
