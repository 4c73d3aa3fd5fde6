"""``GrammarCompiler``: structured-output constraints → grammars over one model's vocabulary.

The engine is llguidance 1.9, chosen over xgrammar 0.2.9 by measurement on this machine
(``python benches/grammar_backends.py``: 2 busy CPUs, SmolLM2's 49,152-token vocabulary; the
range of the medians of four runs):

====================================  ==============  ===============
measured                              llguidance      xgrammar
====================================  ==============  ===============
tokenizer tables (once per model)     195-295 ms      41-79 ms
compile + first mask: small schema    0.5 ms          9-16 ms
compile + first mask: 20-prop schema  1.5-2.0 ms      14-25 ms
compile + first mask: json_object     0.4-0.5 ms      3-5.5 ms
compile + first mask: regex / choice  0.7-1.1 ms      0.4-3.9 ms
one mask row along a JSON output      25-155 us       8-40 us
16 rows, one decode step              110-170 us      35-45 us (its pool: 0.1-3.8 ms)
declared dependencies                 none            torch, transformers, triton, ...
====================================  ==============  ===============

xgrammar precomputes masks when it compiles, so its rows are ~4x cheaper; llguidance builds its
lexer lazily, so a new schema is ready ~10-20x sooner. A request waits for its compile before
its first token, while 16 llguidance rows cost ~0.15 ms a step (filled on llguidance's pool
without the GIL); and llguidance's wheel has no dependencies where xgrammar's requires
transformers and triton. llguidance also refuses JSON-schema keywords it does not implement (a
clear 400) and only allows the canonical tokens of text the grammar forces.

JSON schemas compile with the separators ``json.dumps`` writes (``", "``, ``": "``) and no
other whitespace, so a model cannot spend its tokens on blank space inside the JSON (a schema's
``x-guidance`` options may ask for more).
"""

from __future__ import annotations

import json
import re
import threading
import time
import weakref
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

GRAMMAR_BACKEND = f"llguidance {llguidance.__version__}"
DEFAULT_CACHE_SIZE = 256
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
ANY_JSON_OBJECT = '{"type": "object"}'
# llguidance's default row bound (2,000 Earley items) is below what an object of a few thousand
# optional properties needs (~4 items a property): its mask allows ``{`` and consuming it then
# fails. Sized for the largest schema a request may send (``MAX_GRAMMAR_CHARS`` of the API);
# at ~20k items/ms a step stays within ~10 ms. Terse errors: they reach the client.
PARSER_LIMITS = llguidance.LLParserLimits(
    max_items_in_row=100_000, step_max_items=200_000, verbose_errors=False
)
MAX_ERROR_CHARS = 500
# llguidance's Lark: a ``start`` rule (``?start``/``!start`` too) or its ``%llguidance`` header.
_LARK_START = re.compile(r"(?m)^\s*(%llguidance\b|[?!]?start\s*:)")
# Caret lines and numbered source excerpts in llguidance's errors: noise in an HTTP message.
_ERROR_NOISE = re.compile(r"^(\s*[\^~]+\s*|\s*\d+\s*\|.*)$")


class GrammarError(ValueError):
    """A constraint that cannot be compiled; the message says why (fit for an HTTP 400)."""


class GrammarCompiler:
    """Compiles ``StructuredOutputsParams`` for one tokenizer; safe to call from any thread.

    ``vocab_size`` is the width of the model's logits, at least the tokenizer's vocabulary: ids
    past the tokenizer's vocabulary are never allowed. Compiled grammars are cached by their
    params (the ``cache_size`` most recently used); ``compile`` of equal params returns the same
    ``CompiledGrammar``. A grammar evicted from the cache but still held (by a request between
    the API's compile and the engine, or by a running output's matcher) is found again rather
    than rebuilt, so the engine thread never compiles what the API already did.
    """

    def __init__(
        self, tokenizer: Tokenizer, vocab_size: int, *, cache_size: int = DEFAULT_CACHE_SIZE
    ) -> None:
        if vocab_size < tokenizer.vocab_size:
            raise ValueError(
                f"vocab_size {vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size}"
            )
        # A copy without padding or truncation: llguidance encodes through it.
        backend = tokenizers.Tokenizer.from_str(tokenizer.backend.to_str())
        backend.no_padding()
        backend.no_truncation()
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(tokenizer.eos_token_ids)
        self._tokenizer = llguidance.LLTokenizer(
            backend.to_str(), n_vocab=vocab_size, eos_token=list(self.eos_token_ids)
        )
        self._cache: OrderedDict[StructuredOutputsParams, CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._held: weakref.WeakValueDictionary[StructuredOutputsParams, CompiledGrammar] = (
            weakref.WeakValueDictionary()
        )
        self._lock = threading.Lock()
        self.num_compiled = 0
        self.num_cache_hits = 0
        self.compile_seconds = 0.0

    def compile(self, params: StructuredOutputsParams) -> CompiledGrammar:
        """The grammar of ``params``, from the cache when it is there; ``GrammarError`` (not
        cached) when it cannot be built."""
        with self._lock:
            cached = self._cache.get(params) or self._held.get(params)
            if cached is not None:
                self._cache[params] = cached
                self._cache.move_to_end(params)
                self._evict()
                self.num_cache_hits += 1
                return cached
        # Outside the lock: llguidance drops the GIL while it builds, other threads go on.
        start = time.perf_counter()
        matcher = llguidance.LLMatcher(
            self._tokenizer, _grammar_text(params), log_level=0, limits=PARSER_LIMITS
        )
        if matcher.is_error():
            raise GrammarError(f"invalid {_NOUNS[params.kind]}: {_describe(matcher.get_error())}")
        seconds = time.perf_counter() - start
        compiled = CompiledGrammar(
            prototype=matcher,
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_token_ids,
            compile_seconds=seconds,
        )
        with self._lock:
            self.num_compiled += 1
            self.compile_seconds += seconds
            # Another thread may have compiled the same params meanwhile: all callers get one.
            compiled = self._cache.setdefault(params, compiled)
            self._held[params] = compiled
            self._cache.move_to_end(params)
            self._evict()
        return compiled

    def _evict(self) -> None:
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    @property
    def num_cached(self) -> int:
        with self._lock:
            return len(self._cache)


_NOUNS = {
    "json": "JSON schema",
    "json_object": "JSON schema",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
}


def _grammar_text(params: StructuredOutputsParams) -> str:
    """llguidance's grammar for ``params``; text that is not JSON or GBNF raises
    ``GrammarError``."""
    if params.json is not None or params.json_object:
        text = ANY_JSON_OBJECT if params.json is None else params.json
        try:
            schema = json.loads(text)
        except ValueError as error:
            raise GrammarError(f"invalid JSON schema: not JSON: {error}") from error
        if schema is True:
            text = "{}"  # JSON Schema's "anything", as an object the options can apply to
        elif not isinstance(schema, dict):
            raise GrammarError("invalid JSON schema: a schema is an object or true")
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
        except ValueError as error:
            raise GrammarError(f"invalid JSON schema: {error}") from error
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
    """Lark (a ``start`` rule) stays; GBNF (``root ::= ...``, as llama.cpp and xgrammar take
    it) becomes Lark; anything else is left for llguidance's Lark parser to refuse."""
    if _LARK_START.search(grammar) or "::=" not in grammar:
        return grammar
    try:
        return gbnf_to_lark(grammar)
    except Exception as error:  # the converter raises plain exceptions on bad input
        raise GrammarError(f"invalid grammar: GBNF: {error}") from error


def _describe(message: str) -> str:
    """llguidance's error on one line, without its caret and source-excerpt lines."""
    lines = [line.strip() for line in message.splitlines()]
    kept = [line for line in lines if line and not _ERROR_NOISE.match(line)]
    text = " ".join(kept) or "the grammar is invalid"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."
