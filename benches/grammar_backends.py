"""llguidance against xgrammar, measured on this machine at the default model's vocabulary.

    pip install --no-deps xgrammar  # only for this comparison: its wheel requires transformers
    python benches/grammar_backends.py [--repeats 7] [--steps 48]

Both libraries are driven directly (not through ``metrale_server.structured``), with the same
constraints and the same JSON formatting (separators ``", "`` / ``": "``, no free whitespace).
Each number is a median over ``--repeats`` runs:

* ``tokenizer tables``: building the library's tables of the vocabulary (once per model).
* ``compile``: turning one constraint into a matcher, cold (a new grammar each time, no cache).
* ``compile + first mask``: the same plus the first next-token mask. llguidance builds its
  lexer lazily while xgrammar precomputes masks when it compiles, so this is the fair "time
  before the first constrained token".
* ``fill mask``: mean time to fill one next-token bitmask row along a valid instance's tokens,
  on the first walk of a compiled grammar and on later walks (fresh matchers of the same
  compiled grammar). ``accept token``: mean time to accept one token.
* ``16 masks``: one decode step's masks for 16 matchers (the five constraints, staggered along
  their instances), filled one by one and with the library's parallel fill (llguidance
  ``LLExecutor``, xgrammar ``BatchGrammarMatcher``), both with one thread per CPU.

Then: at how many steps of each walk the two libraries' masks differ, and each wheel's declared
dependencies.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import llguidance
import torch
from bench_host import cpu_line
from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask

from metrale_config import read_gguf_header
from metrale_model_arch import Tokenizer, resolve_model

SEPARATORS = (", ", ": ")
SMALL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}
SMALL_INSTANCE = {"name": "Ann Smith", "age": 42, "role": "admin", "tags": ["a", "b"]}
NULLABLE_STRING: dict[str, Any] = {"anyOf": [{"type": "string"}, {"type": "null"}]}
LARGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.[a-z]{2,3}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "active": {"type": "boolean"},
        "score": {"type": "number"},
        "role": {"enum": ["admin", "user", "guest", "owner"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": {"enum": ["US", "FR", "DE"]},
            },
            "required": ["street", "city", "zip", "country"],
            "additionalProperties": False,
        },
        "contact": {
            "anyOf": [
                {"type": "string"},
                {
                    "type": "object",
                    "properties": {"phone": {"type": "string"}},
                    "required": ["phone"],
                    "additionalProperties": False,
                },
                {"type": "null"},
            ]
        },
        "preferences": {
            "type": "object",
            "properties": {
                "theme": {"enum": ["light", "dark"]},
                "notifications": {"type": "boolean"},
            },
            "required": ["theme", "notifications"],
            "additionalProperties": False,
        },
        "history": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {"date": {"type": "string"}, "amount": {"type": "number"}},
                "required": ["date", "amount"],
                "additionalProperties": False,
            },
        },
        "notes": NULLABLE_STRING,
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "version": {"const": "1.0"},
        "priority": {"enum": [1, 2, 3]},
        "parent_id": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "labels": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
        "code": {"type": "string", "pattern": "^[0-9a-f]{8}$"},
        "comment": NULLABLE_STRING,
    },
    "required": ["id", "name", "email", "active", "role", "address", "version"],
    "additionalProperties": False,
}
LARGE_INSTANCE = {
    "id": 17,
    "name": "Grace Hopper",
    "email": "grace@navy.mil",
    "age": 85,
    "active": True,
    "score": 97.5,
    "role": "owner",
    "tags": ["cobol", "compilers"],
    "address": {"street": "1 Main St", "city": "Arlington", "zip": "22201", "country": "US"},
    "contact": {"phone": "555-0100"},
    "preferences": {"theme": "dark", "notifications": False},
    "history": [{"date": "1952-05-01", "amount": 12.5}],
    "notes": None,
    "rating": 5,
    "version": "1.0",
    "priority": 2,
    "parent_id": None,
    "labels": ["red", "blue"],
    "code": "0a1b2c3d",
    "comment": "first compiler",
}
ANY_OBJECT_INSTANCE = {"city": "Paris", "population": 2102650, "tags": ["capital", None]}
CHOICES = ("positive", "negative", "neutral")

# (name, kind, constraint, a valid output)
CASES: list[tuple[str, str, Any, str]] = [
    ("a small schema", "json", SMALL_SCHEMA, json.dumps(SMALL_INSTANCE)),
    ("b large schema (20 props)", "json", LARGE_SCHEMA, json.dumps(LARGE_INSTANCE)),
    ("c json_object", "json", {"type": "object"}, json.dumps(ANY_OBJECT_INSTANCE)),
    ("d regex", "regex", r"\d{3}-\d{4}", "555-0199"),
    ("e choice of 3", "choice", CHOICES, "negative"),
]


def median_seconds(function: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def num_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class Backend:
    """One library behind the handful of operations the bench times."""

    name = ""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size

    def build_tokenizer(self) -> None:
        raise NotImplementedError

    def compile(self, kind: str, constraint: Any) -> Any:
        raise NotImplementedError

    def matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        raise NotImplementedError

    def accept(self, matcher: Any, token: int) -> bool:
        raise NotImplementedError

    def fill_parallel(self, matchers: Sequence[Any], bitmask: torch.Tensor) -> None:
        raise NotImplementedError


class LLGuidance(Backend):
    name = "llguidance"

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        super().__init__(tokenizer, vocab_size)
        self.executor = llguidance.LLExecutor(num_threads=num_cpus())
        self.build_tokenizer()

    def build_tokenizer(self) -> None:
        self.lltokenizer = llguidance.LLTokenizer(
            self.tokenizer.backend.to_str(),
            n_vocab=self.vocab_size,
            eos_token=list(self.tokenizer.eos_token_ids),
        )

    def compile(self, kind: str, constraint: Any) -> llguidance.LLMatcher:
        if kind == "json":
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                constraint,
                defaults={
                    "whitespace_flexible": False,
                    "item_separator": SEPARATORS[0],
                    "key_separator": SEPARATORS[1],
                },
            )
        elif kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(constraint)
        else:
            alternatives = " | ".join(json.dumps(choice) for choice in constraint)
            grammar = llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
        matcher = llguidance.LLMatcher(self.lltokenizer, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def matcher(self, compiled: llguidance.LLMatcher) -> llguidance.LLMatcher:
        return compiled.deep_copy()

    def fill(self, matcher: llguidance.LLMatcher, bitmask: torch.Tensor, row: int) -> None:
        fill_next_token_bitmask(matcher, bitmask, row)

    def accept(self, matcher: llguidance.LLMatcher, token: int) -> bool:
        return bool(matcher.consume_token(token))

    def fill_parallel(self, matchers: Sequence[Any], bitmask: torch.Tensor) -> None:
        self.executor.unsafe_compute_mask_ptr(
            [(matcher, row) for row, matcher in enumerate(matchers)],
            bitmask.data_ptr(),
            bitmask.shape[1] * 4,
            bitmask.shape[0],
        )


class XGrammar(Backend):
    name = "xgrammar"

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        import xgrammar

        super().__init__(tokenizer, vocab_size)
        self.xgr = xgrammar
        self.batch = xgrammar.BatchGrammarMatcher(max_threads=num_cpus())
        self.build_tokenizer()

    def build_tokenizer(self) -> None:
        backend = self.tokenizer.backend
        special = self.tokenizer.special_token_ids
        # The byte-level spellings ("Ġ" for a space) that VocabType.BYTE_LEVEL decodes; an empty
        # spelling marks a special token, which no grammar text may produce.
        vocab = [
            "" if i in special else backend.id_to_token(i) or ""
            for i in range(self.tokenizer.vocab_size)
        ]
        self.info = self.xgr.TokenizerInfo(
            vocab,
            self.xgr.VocabType.BYTE_LEVEL,
            vocab_size=self.vocab_size,
            stop_token_ids=list(self.tokenizer.eos_token_ids),
        )
        self.compiler = self.xgr.GrammarCompiler(self.info, cache_enabled=False)

    def compile(self, kind: str, constraint: Any) -> Any:
        if kind == "json":
            return self.compiler.compile_json_schema(
                json.dumps(constraint),
                any_whitespace=False,
                separators=SEPARATORS,
                # Strict mode would make {"type": "object"} the empty object only.
                strict_mode=constraint != {"type": "object"},
            )
        if kind == "regex":
            return self.compiler.compile_regex(constraint)
        alternatives = " | ".join(json.dumps(choice) for choice in constraint)
        return self.compiler.compile_grammar(f"root ::= {alternatives}")

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def fill_parallel(self, matchers: Sequence[Any], bitmask: torch.Tensor) -> None:
        self.batch.batch_fill_next_token_bitmask(list(matchers), bitmask)


def allowed_ids(bitmask: torch.Tensor, row: int, vocab_size: int) -> frozenset[int]:
    bits = (bitmask[row, :, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return frozenset(bits.flatten()[:vocab_size].nonzero().flatten().tolist())


def walk(
    backend: Backend, compiled: Any, tokens: list[int], eos: Sequence[int]
) -> tuple[list[float], list[float], list[frozenset[int]]]:
    """Fill then accept each token of a valid output; checks that the end allows EOS."""
    matcher = backend.matcher(compiled)
    bitmask = allocate_token_bitmask(1, backend.vocab_size)
    fills, accepts, masks = [], [], []
    for token in tokens:
        start = time.perf_counter()
        backend.fill(matcher, bitmask, 0)
        middle = time.perf_counter()
        assert backend.accept(matcher, token), (backend.name, token)
        fills.append(middle - start)
        accepts.append(time.perf_counter() - middle)
        masks.append(allowed_ids(bitmask, 0, backend.vocab_size))
    backend.fill(matcher, bitmask, 0)
    final = allowed_ids(bitmask, 0, backend.vocab_size)
    assert set(eos) <= final, (backend.name, "EOS is not allowed at the end")
    masks.append(final)
    return fills, accepts, masks


def batch_step_seconds(
    backend: Backend, compiled: list[Any], paths: list[list[int]], steps: int, parallel: bool
) -> float:
    """Median time of one decode step's 16 masks; each matcher walks its own instance."""
    rows = 16
    bitmask = allocate_token_bitmask(rows, backend.vocab_size)
    matchers, cases, positions = [], [], []
    for row in range(rows):
        case = row % len(compiled)
        matcher = backend.matcher(compiled[case])
        position = (row * 3) % len(paths[case])
        for token in paths[case][:position]:
            assert backend.accept(matcher, token)
        matchers.append(matcher)
        cases.append(case)
        positions.append(position)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        if parallel:
            backend.fill_parallel(matchers, bitmask)
        else:
            for row, matcher in enumerate(matchers):
                backend.fill(matcher, bitmask, row)
        times.append(time.perf_counter() - start)
        for row, case in enumerate(cases):
            if positions[row] == len(paths[case]):
                matchers[row], positions[row] = backend.matcher(compiled[case]), 0
            else:
                assert backend.accept(matchers[row], paths[case][positions[row]])
                positions[row] += 1
    return statistics.median(times)


def measure(
    backend: Backend, tokenizer: Tokenizer, repeats: int, steps: int
) -> tuple[dict[str, float], dict[str, list[frozenset[int]]]]:
    results: dict[str, float] = {}
    masks: dict[str, list[frozenset[int]]] = {}
    results["tokenizer"] = median_seconds(backend.build_tokenizer, max(3, repeats // 2))
    compiled_all, paths = [], []
    eos = tokenizer.eos_token_ids
    for name, kind, constraint, text in CASES:

        def compile_only(kind: str = kind, constraint: Any = constraint) -> None:
            backend.compile(kind, constraint)

        def compile_and_fill(kind: str = kind, constraint: Any = constraint) -> None:
            matcher = backend.matcher(backend.compile(kind, constraint))
            backend.fill(matcher, allocate_token_bitmask(1, backend.vocab_size), 0)

        results[f"{name}|compile"] = median_seconds(compile_only, repeats)
        results[f"{name}|compile+1st"] = median_seconds(compile_and_fill, repeats)
        compiled = backend.compile(kind, constraint)
        tokens = tokenizer.encode(text, add_special_tokens=False)
        fills, _, masks[name] = walk(backend, compiled, tokens, eos)
        results[f"{name}|fill cold"] = statistics.fmean(fills)
        warm_fills, warm_accepts = [], []
        for _ in range(repeats):
            fills, accepts, _ = walk(backend, compiled, tokens, eos)
            warm_fills.append(statistics.fmean(fills))
            warm_accepts.append(statistics.fmean(accepts))
        results[f"{name}|fill warm"] = statistics.median(warm_fills)
        results[f"{name}|accept"] = statistics.median(warm_accepts)
        results[f"{name}|tokens"] = len(tokens)
        compiled_all.append(compiled)
        paths.append(tokens)
    for parallel, label in ((False, "batch seq"), (True, "batch par")):
        results[label] = statistics.median(
            batch_step_seconds(backend, compiled_all, paths, steps, parallel)
            for _ in range(max(3, repeats // 2))
        )
    return results, masks


def print_table(all_results: dict[str, dict[str, float]]) -> None:
    names = list(all_results)
    print(f"{'':38s}" + "".join(f"{name:>14s}" for name in names))

    def row(label: str, key: str, scale: float, unit: str) -> None:
        cells = "".join(f"{all_results[name][key] * scale:11.2f} {unit}" for name in names)
        print(f"{label:38s}{cells}")

    row("tokenizer tables", "tokenizer", 1e3, "ms")
    for case, *_ in CASES:
        print(f"{case} ({int(all_results[names[0]][f'{case}|tokens'])} tokens)")
        row("  compile", f"{case}|compile", 1e3, "ms")
        row("  compile + first mask", f"{case}|compile+1st", 1e3, "ms")
        row("  fill mask, first walk", f"{case}|fill cold", 1e6, "us")
        row("  fill mask, later walks", f"{case}|fill warm", 1e6, "us")
        row("  accept token", f"{case}|accept", 1e6, "us")
    row("16 masks a step, one by one", "batch seq", 1e6, "us")
    row("16 masks a step, parallel fill", "batch par", 1e6, "us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=48, help="decode steps of the 16-row batch")
    args = parser.parse_args()
    print(cpu_line())
    tokenizer = Tokenizer.from_gguf_fields(read_gguf_header(resolve_model(None).path).fields)
    vocab_size = tokenizer.vocab_size
    print(
        f"vocabulary {vocab_size}, EOS {tokenizer.eos_token_ids}, {num_cpus()} CPUs, "
        f"{llguidance.get_version()}"
    )
    backends: list[Backend] = [LLGuidance(tokenizer, vocab_size)]
    try:
        backends.append(XGrammar(tokenizer, vocab_size))
    except ImportError:
        print("xgrammar is not installed (pip install --no-deps xgrammar to compare)")
    all_results, all_masks = {}, {}
    for backend in backends:
        all_results[backend.name], all_masks[backend.name] = measure(
            backend, tokenizer, args.repeats, args.steps
        )
    print_table(all_results)
    if len(all_masks) == 2:
        first, second = all_masks.values()
        for case, *_ in CASES:
            differing = sum(a != b for a, b in zip(first[case], second[case], strict=True))
            print(f"masks differ at {differing} of {len(first[case])} steps of {case}")
    for backend in backends:
        requires = importlib.metadata.requires(backend.name) or []
        needed = [r.split(";")[0].strip() for r in requires if "extra ==" not in r]
        print(f"{backend.name} requires: {', '.join(needed) or 'nothing'}")


if __name__ == "__main__":
    main()
