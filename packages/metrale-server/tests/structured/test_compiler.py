"""Grammars over the default model's vocabulary: walked token by token along valid outputs,
refusing what they do not allow, compiled once per constraint."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from metrale_model_arch import Tokenizer
from metrale_server.structured import (
    GrammarCompiler,
    GrammarError,
    GrammarMatcher,
    StructuredOutputsParams,
    allocate_bitmask,
    fill_bitmasks,
    unpack_bitmask,
)

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def compiler(default_tokenizer: Tokenizer) -> GrammarCompiler:
    # Wider than the tokenizer: ids past its vocabulary must never be allowed.
    return GrammarCompiler(default_tokenizer, default_tokenizer.vocab_size + 64)


def allowed(matcher: GrammarMatcher, vocab_size: int) -> torch.Tensor:
    bitmask = allocate_bitmask(1, vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    return unpack_bitmask(bitmask, vocab_size)[0]


def walk(
    compiler: GrammarCompiler, tokenizer: Tokenizer, params: StructuredOutputsParams, text: str
) -> GrammarMatcher:
    """Feed ``text``'s tokens, checking each was allowed by the mask before it."""
    matcher = compiler.compile(params).matcher()
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert allowed(matcher, compiler.vocab_size)[token], (text, token)
        assert matcher.accept_token(token)
    return matcher


def test_a_schema_walks_to_its_end_and_then_allows_only_eos(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    params = StructuredOutputsParams(json=SCHEMA)
    matcher = walk(compiler, default_tokenizer, params, '{"name": "Ann", "age": 42}')
    assert matcher.is_terminated
    mask = allowed(matcher, compiler.vocab_size)
    assert mask.nonzero().flatten().tolist() == list(default_tokenizer.eos_token_ids)


def test_tokens_outside_the_grammar_are_masked_and_refused(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    matcher = compiler.compile(StructuredOutputsParams(regex="[0-9]{3}")).matcher()
    mask = allowed(matcher, compiler.vocab_size)
    letter = default_tokenizer.encode("x", add_special_tokens=False)[0]
    assert not mask[letter]
    assert not mask[default_tokenizer.vocab_size :].any()
    assert not mask[list(default_tokenizer.eos_token_ids)].any()
    assert not matcher.accept_token(letter)


def test_choice_regex_and_gbnf(compiler: GrammarCompiler, default_tokenizer: Tokenizer) -> None:
    choice = StructuredOutputsParams(choice=("yes", "no", 'café "quoted"'))
    assert walk(compiler, default_tokenizer, choice, 'café "quoted"').is_terminated
    regex = StructuredOutputsParams(regex=r"[a-z]+@[a-z]+\.com")
    assert walk(compiler, default_tokenizer, regex, "ann@mail.com").is_terminated
    gbnf = StructuredOutputsParams(grammar='root ::= "ab" [0-9]')
    assert walk(compiler, default_tokenizer, gbnf, "ab7").is_terminated
    lark = StructuredOutputsParams(grammar='start: "ab" /[0-9]/')
    assert walk(compiler, default_tokenizer, lark, "ab7").is_terminated


def test_rollback_restores_the_mask(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    params = StructuredOutputsParams(json=SCHEMA)
    matcher = compiler.compile(params).matcher()
    tokens = default_tokenizer.encode('{"name": "Bo', add_special_tokens=False)
    for token in tokens[:2]:
        assert matcher.accept_token(token)
    before = allowed(matcher, compiler.vocab_size)
    for token in tokens[2:]:
        assert matcher.accept_token(token)
    matcher.rollback(len(tokens) - 2)
    assert torch.equal(allowed(matcher, compiler.vocab_size), before)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (StructuredOutputsParams(regex="(unclosed"), "unclosed"),
        (StructuredOutputsParams(json={"type": "nonsense"}), "nonsense"),
        (StructuredOutputsParams(json="{not json"), "JSON"),
        (StructuredOutputsParams(grammar="start: undefined_rule"), "undefined_rule"),
    ],
)
def test_bad_constraints_raise_grammar_error(
    compiler: GrammarCompiler, params: StructuredOutputsParams, message: str
) -> None:
    with pytest.raises(GrammarError, match=message):
        compiler.compile(params)


def test_compiled_once_per_constraint_from_any_thread(compiler: GrammarCompiler) -> None:
    params = StructuredOutputsParams(json={**SCHEMA, "title": "threads"})
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(compiler.compile(params))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4
    assert compiler.compile(params) is compiler.compile(params)
    # The same schema as a dict or as JSON text is the same constraint.
    as_text = StructuredOutputsParams(json=json.dumps({**SCHEMA, "title": "threads"}))
    assert compiler.compile(as_text) is compiler.compile(params)


def test_batch_fill_equals_row_by_row(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    texts = ['{"na', '{"name": "A', '{"name": "Al", "a', "", '{"name": "Al", "age": 1']
    matchers = []
    for text in texts:
        matcher = compiler.compile(StructuredOutputsParams(json=SCHEMA)).matcher()
        for token in default_tokenizer.encode(text, add_special_tokens=False):
            assert matcher.accept_token(token)
        matchers.append(matcher)
    together = allocate_bitmask(len(matchers), compiler.vocab_size)
    fill_bitmasks(matchers, together)
    for row, matcher in enumerate(matchers):
        alone = allocate_bitmask(1, compiler.vocab_size)
        matcher.fill_bitmask(alone, 0)
        assert torch.equal(together[row], alone[0])


def test_params_take_exactly_one_constraint() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", json_object=True)
    with pytest.raises(ValueError, match="non-empty"):
        StructuredOutputsParams(choice=("a", ""))
    assert StructuredOutputsParams(choice=["a", "b"]).kind == "choice"
