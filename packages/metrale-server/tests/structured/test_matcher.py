"""``GrammarMatcher``: masks along valid outputs, refused tokens, end of sequence, rollback,
batched fills, and random walks that must always decode to valid JSON."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import jsonschema
import pytest
import torch

from metrale_model_arch import Tokenizer
from metrale_server.structured import (
    GrammarCompiler,
    GrammarMatcher,
    StructuredOutputsParams,
    allocate_bitmask,
    fill_bitmasks,
)
from metrale_server.structured import matcher as matcher_module

from .helpers import allowed, encode, ids_in_row, walk

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PERSON_TEXT = '{"name": "Ann", "age": 42}'
# Every output is finite: bounded strings, enums, bounded arrays and integers, no extra keys.
BOUNDED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "role": {"enum": ["admin", "user", "guest"]},
        "level": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {
            "type": "array",
            "items": {"type": "string", "maxLength": 4},
            "maxItems": 3,
        },
        "active": {"type": "boolean"},
        "manager": {"anyOf": [{"type": "null"}, {"const": "boss"}]},
    },
    "required": ["name", "role", "level", "tags"],
    "additionalProperties": False,
}


def test_a_schema_walks_to_its_end_then_allows_only_eos(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    matcher = walk(compiler, default_tokenizer, StructuredOutputsParams(json=PERSON), PERSON_TEXT)
    assert matcher.is_terminated
    assert matcher.is_stop_allowed
    assert allowed(matcher) == set(default_tokenizer.eos_token_ids)
    assert matcher.num_accepted_tokens == len(encode(default_tokenizer, PERSON_TEXT))
    assert matcher.error is None


def test_eos_is_masked_and_refused_until_the_grammar_is_complete(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    [eos] = default_tokenizer.eos_token_ids
    matcher = compiler.compile(StructuredOutputsParams(json=PERSON)).matcher()
    for token in encode(default_tokenizer, PERSON_TEXT)[:-1]:
        assert eos not in allowed(matcher)
        assert not matcher.is_stop_allowed
        assert not matcher.accept_token(eos)
        assert matcher.accept_token(token)
    assert not matcher.is_terminated


def test_tokens_outside_the_grammar_are_masked_and_refused_without_a_trace(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    vocab = default_tokenizer.vocab_size
    matcher = compiler.compile(StructuredOutputsParams(regex="[0-9]{3}")).matcher()
    assert matcher.accept_token(encode(default_tokenizer, "1")[0])
    mask = allowed(matcher)
    letter = encode(default_tokenizer, "x")[0]
    im_start = default_tokenizer.token_to_id("<|im_start|>")
    assert letter not in mask
    assert im_start not in mask
    assert max(mask) < vocab  # no id past the tokenizer, up to the logits' width
    for token in [letter, im_start, vocab, vocab + 10, compiler.vocab_size, -1]:
        assert not matcher.accept_token(token)
    # Refusals changed nothing: the same mask, and the grammar goes on.
    assert allowed(matcher) == mask
    assert matcher.num_accepted_tokens == 1
    assert matcher.error is None
    for token in encode(default_tokenizer, "23"):
        assert matcher.accept_token(token)
    assert matcher.is_terminated


def test_an_open_ended_grammar_ends_when_eos_is_accepted(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    [eos] = default_tokenizer.eos_token_ids
    matcher = walk(compiler, default_tokenizer, StructuredOutputsParams(regex="[a-z]+"), "abc")
    before = allowed(matcher)
    assert eos in before
    assert len(before) > 1
    assert matcher.is_stop_allowed
    assert not matcher.is_terminated
    assert matcher.accept_token(eos)
    assert matcher.is_terminated
    assert allowed(matcher) == {eos}
    assert not matcher.accept_token(encode(default_tokenizer, "d")[0])
    matcher.rollback(1)
    assert not matcher.is_terminated
    assert allowed(matcher) == before
    assert matcher.accept_token(encode(default_tokenizer, "d")[0])


def test_a_finished_choice_terminates_before_eos(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    [eos] = default_tokenizer.eos_token_ids
    params = StructuredOutputsParams(choice=("green", "red"))
    matcher = walk(compiler, default_tokenizer, params, "green")
    assert matcher.is_terminated
    assert allowed(matcher) == {eos}
    assert matcher.accept_token(eos)
    assert matcher.num_accepted_tokens == len(encode(default_tokenizer, "green")) + 1
    matcher.rollback(matcher.num_accepted_tokens)
    assert not matcher.is_terminated
    assert allowed(matcher) == allowed(compiler.compile(params).matcher())


def test_rollback_restores_every_earlier_mask(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    [eos] = default_tokenizer.eos_token_ids
    matcher = compiler.compile(StructuredOutputsParams(json=PERSON)).matcher()
    tokens = [*encode(default_tokenizer, PERSON_TEXT), eos]
    masks = []
    for token in tokens:
        masks.append(allowed(matcher))
        assert matcher.accept_token(token)
    masks.append(allowed(matcher))
    for depth in [1, 3, 2, len(tokens)]:
        matcher.rollback(depth)
        assert matcher.num_accepted_tokens == len(tokens) - depth
        assert allowed(matcher) == masks[len(tokens) - depth], depth
        for token in tokens[len(tokens) - depth :]:
            assert matcher.accept_token(token)
    matcher.rollback(0)
    assert matcher.is_terminated
    with pytest.raises(ValueError, match="cannot roll back"):
        matcher.rollback(len(tokens) + 1)
    with pytest.raises(ValueError, match="cannot roll back"):
        matcher.rollback(-1)
    assert matcher.num_accepted_tokens == len(tokens)


PREFIXES = [
    (BOUNDED, ""),
    (PERSON, '{"na'),
    (BOUNDED, '{"name": "A'),
    (PERSON, '{"name": "Al", "'),
    (PERSON, '{"name": "Al", "age": 1'),
    (BOUNDED, '{"name": "Al", "role": "guest", "level": 7, "tags": ['),
]


@pytest.mark.parametrize("num_rows", [1, 3, matcher_module.PARALLEL_FILL_ROWS + 2])
def test_batch_fill_equals_row_by_row(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer, num_rows: int
) -> None:
    matchers = []
    for schema, prefix in (PREFIXES * 3)[:num_rows]:
        matcher = compiler.compile(StructuredOutputsParams(json=schema)).matcher()
        assert all(map(matcher.accept_token, encode(default_tokenizer, prefix)))
        matchers.append(matcher)
    if num_rows > 1:  # one output already ended by EOS: its row allows EOS only
        finished = compiler.compile(StructuredOutputsParams(regex="a+")).matcher()
        assert finished.accept_token(encode(default_tokenizer, "a")[0])
        assert finished.accept_token(default_tokenizer.eos_token_ids[0])
        matchers[-1] = finished
    together = allocate_bitmask(num_rows + 1, compiler.vocab_size)
    together[num_rows] = 12345
    fill_bitmasks(matchers, together)
    for row, matcher in enumerate(matchers):
        alone = allocate_bitmask(1, compiler.vocab_size)
        matcher.fill_bitmask(alone, 0)
        assert torch.equal(together[row], alone[0]), row
    assert (together[num_rows] == 12345).all()  # rows past the matchers are left alone
    if num_rows > 1:
        assert ids_in_row(together[num_rows - 1]) == set(default_tokenizer.eos_token_ids)


def test_bitmasks_of_the_wrong_layout_are_refused(compiler: GrammarCompiler) -> None:
    matcher = compiler.compile(StructuredOutputsParams(regex="a")).matcher()
    good = allocate_bitmask(2, compiler.vocab_size)
    for bad in [
        good.to(torch.int64),
        allocate_bitmask(2, compiler.vocab_size + 32),
        allocate_bitmask(2, compiler.vocab_size - 64),
        good[:, :-1],
        good.t().contiguous().t(),
    ]:
        with pytest.raises(ValueError, match="grammar bitmask"):
            matcher.fill_bitmask(bad, 0)
        with pytest.raises(ValueError, match="grammar bitmask"):
            fill_bitmasks([matcher, matcher], bad)
    with pytest.raises(ValueError, match="grammar bitmask"):
        fill_bitmasks([matcher] * 3, good)


def test_matchers_are_independent_and_made_from_any_thread(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer
) -> None:
    compiled = compiler.compile(StructuredOutputsParams(json=PERSON))
    tokens = encode(default_tokenizer, PERSON_TEXT)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(10):
                matcher = compiled.matcher()
                for token in tokens:
                    assert token in allowed(matcher)
                    assert matcher.accept_token(token)
                assert matcher.is_terminated
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert compiled.matcher().num_accepted_tokens == 0


def test_the_tiny_vocabulary_masks_exactly_the_valid_prefixes(
    tiny_compiler: GrammarCompiler, tiny_tokenizer: Tokenizer
) -> None:
    choices = ("yes", "no", "yak")
    matcher = tiny_compiler.compile(StructuredOutputsParams(choice=choices)).matcher()
    written = ""
    for step in "yak":
        mask = allowed(matcher)
        assert max(mask) < tiny_tokenizer.vocab_size  # 53 ids, 100 logits
        assert 0 not in mask  # EOS
        # Every allowed token continues some choice; every one-character continuation is there.
        for token in mask:
            text = written + tiny_tokenizer.decode([token])
            assert any(choice.startswith(text) for choice in choices), text
        for choice in choices:
            if choice.startswith(written) and choice != written:
                assert tiny_tokenizer.token_to_id(choice[len(written)]) in mask
        assert matcher.accept_token(encode(tiny_tokenizer, step)[0])
        written += step
    assert matcher.is_terminated
    assert allowed(matcher) == {0}


def random_output(matcher: GrammarMatcher, eos: set[int], seed: int, limit: int) -> list[int]:
    """Tokens drawn uniformly from the mask until EOS is drawn or the grammar ends."""
    generator = random.Random(seed)
    tokens: list[int] = []
    while not matcher.is_terminated:
        assert len(tokens) < limit, "the walk did not end"
        token = generator.choice(sorted(allowed(matcher)))
        assert matcher.accept_token(token)
        if token in eos:
            break
        tokens.append(token)
    return tokens


@pytest.mark.parametrize("seed", range(50))
def test_random_walks_decode_to_valid_json(
    compiler: GrammarCompiler, default_tokenizer: Tokenizer, seed: int
) -> None:
    matcher = compiler.compile(StructuredOutputsParams(json=BOUNDED)).matcher()
    tokens = random_output(matcher, set(default_tokenizer.eos_token_ids), seed, limit=400)
    text = default_tokenizer.decode(tokens)
    value: Any = json.loads(text)
    jsonschema.validate(value, BOUNDED)
