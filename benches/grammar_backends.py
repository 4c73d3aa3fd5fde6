"""llguidance against xgrammar on this machine, at the default model's vocabulary (49,152).

    pip install xgrammar  # not a dependency: it also pulls in transformers and triton
    python benches/grammar_backends.py

For each library: building its tokenizer tables (once per model), compiling each constraint
(cold: a new compiler, so no cache), and the mean time to fill one next-token mask and accept
one token while walking a valid output token by token. The numbers chose llguidance
(``metrale_server.structured``); xgrammar is measured only when it is installed.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from metrale_config import read_gguf_header
from metrale_model_arch import Tokenizer, resolve_model
from metrale_server.structured import (
    GrammarCompiler,
    StructuredOutputsParams,
    allocate_bitmask,
)

RECORD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}
WIDE = {
    "type": "object",
    "properties": {
        **{f"field_{i}": {"type": "string"} for i in range(16)},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["street", "zip"],
        },
        "contact": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "score": {"type": "number"},
    },
    "required": [f"field_{i}" for i in range(16)],
}
CASES: list[tuple[str, dict[str, Any], str]] = [
    (
        "record schema",
        {"json": RECORD},
        '{"name": "Ann", "age": 42, "role": "admin", "tags": ["a", "b"]}',
    ),
    (
        "wide schema (20 fields)",
        {"json": WIDE},
        json.dumps({f"field_{i}": f"value {i}" for i in range(16)}),
    ),
    ("regex", {"regex": "[0-9]{3}-[0-9]{4}"}, "555-0199"),
    ("choice of 3", {"choice": ["red", "green", "blue"]}, "green"),
]


def timed(function: Callable[[], Any], repeats: int = 5) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def bench_llguidance(tokenizer: Tokenizer) -> None:
    vocab_size = tokenizer.vocab_size
    setup, compiler = timed(lambda: GrammarCompiler(tokenizer, vocab_size), repeats=3)
    print(f"llguidance  tokenizer tables {setup * 1e3:8.1f} ms")
    for name, spec, text in CASES:
        params = StructuredOutputsParams(**spec)
        cold, compiled = timed(lambda: GrammarCompiler.compile(_fresh(compiler), params))  # noqa: B023
        tokens = tokenizer.encode(text, add_special_tokens=False)
        matcher = compiled.matcher()
        bitmask = allocate_bitmask(1, vocab_size)
        start = time.perf_counter()
        for token in tokens:
            matcher.fill_bitmask(bitmask, 0)
            assert matcher.accept_token(token)
        per_token = (time.perf_counter() - start) / len(tokens)
        print(
            f"llguidance  {name:24s} compile {cold * 1e3:8.2f} ms   "
            f"mask+accept {per_token * 1e6:8.1f} us/token"
        )


def _fresh(compiler: GrammarCompiler) -> GrammarCompiler:
    """The same tokenizer tables with an empty cache (a cold compile)."""
    fresh = object.__new__(GrammarCompiler)
    fresh.__dict__.update(compiler.__dict__)
    fresh._cache = type(compiler._cache)()
    return fresh


def bench_xgrammar(tokenizer: Tokenizer) -> None:
    try:
        import xgrammar as xgr
    except ImportError:
        print("xgrammar    not installed (pip install xgrammar to compare)")
        return
    vocab_size = tokenizer.vocab_size
    backend = tokenizer.backend
    vocab = [backend.id_to_token(i) or "" for i in range(vocab_size)]

    def build() -> Any:
        return xgr.TokenizerInfo(
            vocab,
            xgr.VocabType.BYTE_LEVEL,
            vocab_size=vocab_size,
            stop_token_ids=list(tokenizer.eos_token_ids),
        )

    setup, info = timed(build, repeats=3)
    print(f"xgrammar    tokenizer tables {setup * 1e3:8.1f} ms")
    for name, spec, text in CASES:

        def compile_cold(spec: dict[str, Any] = spec) -> Any:
            compiler = xgr.GrammarCompiler(info, cache_enabled=False)
            if "json" in spec:
                return compiler.compile_json_schema(
                    json.dumps(spec["json"]), any_whitespace=False, separators=(", ", ": ")
                )
            if "regex" in spec:
                return compiler.compile_regex(spec["regex"])
            choices = " | ".join(json.dumps(c) for c in spec["choice"])
            return compiler.compile_grammar(f"root ::= {choices}")

        cold, compiled = timed(compile_cold)
        matcher = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        tokens = tokenizer.encode(text, add_special_tokens=False)
        start = time.perf_counter()
        for token in tokens:
            matcher.fill_next_token_bitmask(bitmask, 0)
            assert matcher.accept_token(token)
        per_token = (time.perf_counter() - start) / len(tokens)
        print(
            f"xgrammar    {name:24s} compile {cold * 1e3:8.2f} ms   "
            f"mask+accept {per_token * 1e6:8.1f} us/token"
        )


def main() -> None:
    torch.set_num_threads(2)
    tokenizer = Tokenizer.from_gguf_fields(read_gguf_header(resolve_model(None).path).fields)
    bench_llguidance(tokenizer)
    bench_xgrammar(tokenizer)


if __name__ == "__main__":
    main()
