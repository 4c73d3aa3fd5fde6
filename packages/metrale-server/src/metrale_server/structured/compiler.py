"""``GrammarCompiler``: structured-output constraints → grammars over one model's vocabulary.

The engine is llguidance (Microsoft's Rust grammar engine, a 3 MB wheel with no Python
dependencies), chosen over xgrammar by measurement on this machine (``benches/
grammar_backends.py``): on the default model's 49,152-token vocabulary llguidance reads the
tokenizer in ~0.3 s, builds a schema's matcher in under a millisecond and fills a next-token
mask in tens of microseconds; xgrammar's wheel also pulls in transformers and triton.

JSON schemas compile with the separators ``json.dumps`` writes (``", "``, ``": "``) and no
other free whitespace, so a model cannot spend its tokens on blank space inside the JSON.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import llguidance
import tokenizers
from llguidance.gbnf_to_lark import gbnf_to_lark

from metrale_model_arch import Tokenizer
from metrale_server.structured.matcher import CompiledGrammar
from metrale_server.structured.params import StructuredOutputsParams

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

GRAMMAR_BACKEND = f"llguidance {llguidance.get_version()}"
DEFAULT_CACHE_SIZE = 256
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
ANY_JSON_OBJECT = {"type": "object"}


class GrammarError(ValueError):
    """A constraint that cannot be compiled; the message says why (fit for an HTTP 400)."""


class GrammarCompiler:
    """Compiles ``StructuredOutputsParams`` for one tokenizer; safe to call from any thread.

    ``vocab_size`` is the width of the model's logits: ids past the tokenizer's vocabulary are
    never allowed. Compiled grammars are cached by their params (least recently used out).
    """

    def __init__(
        self, tokenizer: Tokenizer, vocab_size: int, *, cache_size: int = DEFAULT_CACHE_SIZE
    ) -> None:
        backend = tokenizers.Tokenizer.from_str(tokenizer.backend.to_str())
        backend.no_padding()
        backend.no_truncation()
        self.vocab_size = vocab_size
        self._tokenizer = llguidance.LLTokenizer(
            backend.to_str(), n_vocab=vocab_size, eos_token=list(tokenizer.eos_token_ids)
        )
        self._cache: OrderedDict[StructuredOutputsParams, CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.num_compiled = 0
        self.num_cache_hits = 0

    def compile(self, params: StructuredOutputsParams) -> CompiledGrammar:
        """The grammar of ``params`` (cached); ``GrammarError`` when it cannot be built."""
        with self._lock:
            cached = self._cache.get(params)
            if cached is not None:
                self._cache.move_to_end(params)
                self.num_cache_hits += 1
                return cached
        # Outside the lock: llguidance drops the GIL while it builds, other threads go on.
        matcher = llguidance.LLMatcher(self._tokenizer, _grammar_text(params), log_level=0)
        if matcher.is_error():
            raise GrammarError(_first_line(matcher.get_error()))
        compiled = CompiledGrammar(matcher, self.vocab_size)
        with self._lock:
            self._cache[params] = compiled
            self.num_compiled += 1
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled


def _grammar_text(params: StructuredOutputsParams) -> str:
    """llguidance's grammar for ``params``; malformed JSON schemas raise ``GrammarError``."""
    if params.json is not None or params.json_object:
        schema = ANY_JSON_OBJECT if params.json is None else params.json
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except ValueError as error:
            raise GrammarError(f"not a JSON schema: {error}") from error
    if params.regex is not None:
        return llguidance.LLMatcher.grammar_from_regex(params.regex)
    if params.choice is not None:
        # Lark string literals take JSON's escapes.
        alternatives = " | ".join(
            json.dumps(choice, ensure_ascii=False) for choice in params.choice
        )
        return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
    assert params.grammar is not None
    return llguidance.LLMatcher.grammar_from_lark(_as_lark(params.grammar))


def _as_lark(grammar: str) -> str:
    """GBNF (``root ::= ...``, as llama.cpp and xgrammar take it) becomes Lark; Lark stays."""
    if "::=" not in grammar:
        return grammar
    try:
        return gbnf_to_lark(grammar)
    except Exception as error:  # the converter raises plain exceptions on bad input
        raise GrammarError(f"not a GBNF grammar: {error}") from error


def _first_line(message: str) -> str:
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return "; ".join(lines[:3]) if lines else "the grammar is invalid"
