"""Grammar compilers over the default model's vocabulary and over a tiny hand-made one."""

from __future__ import annotations

import pytest

from metrale_model_arch import Tokenizer
from metrale_server.structured import GrammarCompiler

# Logits wider than the default tokenizer's 49,152 ids, as padded embedding tables are.
EXTRA_IDS = 64

TINY_CHARS = [*'abcdefghijklmnopqrstuvwxyz0123456789{}[]":,-.', "Ġ"]  # Ġ: byte-level space
TINY_MERGES = ["y e", "ye s", "n o", '{ "', '" :', 'Ġ "']
TINY_WIDTH = 100


@pytest.fixture(scope="session")
def compiler(default_tokenizer: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(default_tokenizer, default_tokenizer.vocab_size + EXTRA_IDS)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    """Byte-level BPE over 53 ids: ``<|end|>`` (EOS, id 0), single characters and six merges."""
    merged = [merge.replace(" ", "") for merge in TINY_MERGES]
    tokens = ["<|end|>", *TINY_CHARS, *merged]
    return Tokenizer.from_gguf_fields(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": TINY_MERGES,
            "tokenizer.ggml.token_type": [3] + [1] * (len(tokens) - 1),
            "tokenizer.ggml.eos_token_id": 0,
        }
    )


@pytest.fixture(scope="session")
def tiny_compiler(tiny_tokenizer: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tiny_tokenizer, TINY_WIDTH)
