"""Reading a matcher's mask as token ids, and walking a grammar along a text's tokens.

Masks are decoded here word by word in plain Python: a reference independent of
``unpack_bitmask``, and as cheap as the number of allowed tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from metrale_model_arch import Tokenizer
from metrale_server.structured import (
    GrammarCompiler,
    GrammarMatcher,
    StructuredOutputsParams,
    allocate_bitmask,
)

WORD = 0xFFFFFFFF


def ids_in_row(row: torch.Tensor) -> frozenset[int]:
    """The token ids whose bits are set in one int32 bitmask row."""
    ids = []
    for index, word in enumerate(row.tolist()):
        word &= WORD
        while word:
            lowest = word & -word
            ids.append(32 * index + lowest.bit_length() - 1)
            word ^= lowest
    return frozenset(ids)


def allowed(matcher: GrammarMatcher) -> frozenset[int]:
    """The tokens the matcher's mask allows next."""
    bitmask = allocate_bitmask(1, matcher.grammar.vocab_size)
    bitmask.zero_()
    matcher.fill_bitmask(bitmask, 0)
    return ids_in_row(bitmask[0])


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def walk(
    compiler: GrammarCompiler, tokenizer: Tokenizer, params: StructuredOutputsParams, text: str
) -> GrammarMatcher:
    """A matcher fed ``text``'s tokens, each checked to be in the mask before it is accepted,
    with the EOS tokens in the mask exactly when ``is_stop_allowed``."""
    matcher = compiler.compile(params).matcher()
    for token in encode(tokenizer, text):
        mask = allowed(matcher)
        assert token in mask, (text, tokenizer.decode([token]))
        assert has_eos(mask, tokenizer.eos_token_ids) == matcher.is_stop_allowed
        assert matcher.accept_token(token), (text, tokenizer.decode([token]))
    assert has_eos(allowed(matcher), tokenizer.eos_token_ids) == matcher.is_stop_allowed
    return matcher


def has_eos(mask: frozenset[int], eos_token_ids: Sequence[int]) -> bool:
    """Whether all EOS tokens are allowed; ``AssertionError`` if only some are."""
    present = {token in mask for token in eos_token_ids}
    assert len(present) == 1, "some EOS tokens are allowed and others are not"
    return present.pop()


def is_complete_match(
    compiler: GrammarCompiler, tokenizer: Tokenizer, params: StructuredOutputsParams, text: str
) -> bool:
    """Whether the grammar takes all of ``text`` and may end there."""
    matcher = compiler.compile(params).matcher()
    return (
        all(matcher.accept_token(token) for token in encode(tokenizer, text))
        and matcher.is_stop_allowed
    )
