"""Incremental detokenization on a real byte-level BPE tokenizer: never half a character."""

from __future__ import annotations

import pytest

from metrale_config import read_gguf_header
from metrale_model_arch import Tokenizer, resolve_model
from metrale_server.output.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer

TEXTS = [
    "Hello, world! The capital of France is Paris.",
    "naïve café — déjà vu, Œuvre",
    "日本語のテキストと中文字符",
    "emoji 👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 done",
    "def f(x):\n\treturn x  # tab and  spaces\n\n",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    header = read_gguf_header(resolve_model(None).path)
    return Tokenizer.from_gguf_fields(header.fields)


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_concatenate_to_the_text_and_are_whole(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.push(token_id) for token_id in ids]
    pieces.append(detokenizer.flush())
    assert "".join(pieces) == text
    assert not any(REPLACEMENT_CHAR in piece for piece in pieces)


def test_multibyte_character_split_across_tokens_is_held_back(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("👨‍👩‍👧‍👦", add_special_tokens=False)
    # A family emoji is many bytes; byte-level BPE spells part of it with partial-byte tokens.
    assert any(REPLACEMENT_CHAR in tokenizer.decode([i]) for i in ids)
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert "".join(detokenizer.push(i) for i in ids) == "👨‍👩‍👧‍👦"


def test_flush_releases_a_dangling_partial_character(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("é👍", add_special_tokens=False)
    partial = [i for i in ids if REPLACEMENT_CHAR in tokenizer.decode([i])]
    assert partial
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert detokenizer.push(partial[0]) == ""
    assert detokenizer.flush() == tokenizer.decode([partial[0]])
