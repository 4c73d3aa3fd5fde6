"""The cost of structured outputs: 16 constrained streams ÷ the same 16 unconstrained, and the
grammar compile time per schema.

    python benches/structured_throughput.py [--streams 16] [--repeats 3]

A ``met serve`` child process serves the bundled default model with its defaults (and
``--max-batch-size`` = ``--streams``). Each round sends ``--streams`` chat requests at once,
temperature 1 with a seed per stream, every one constrained by a JSON schema (an array of 8
records): the grammar decides where each ends. Then the same prompts and seeds go out
unconstrained, each with ``max_tokens`` = the tokens its constrained twin made and
``ignore_eos``, so both runs make exactly the same number of tokens. Throughput = output tokens
/ wall time (first request sent to last response); the best of ``--repeats`` interleaved rounds
of each. Goal: constrained ÷ unconstrained >= 0.9.

Compile times are measured in this process, with the server's ``GrammarCompiler`` on the
default model's tokenizer, cold (a new compiler, so no cache) and then cached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import httpx
import jsonschema
import openai
from bench_host import cpu_line

from metrale_bench.server_process import ServerProcess

RECORDS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 8,
    "maxItems": 8,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 3, "maxLength": 12},
            "score": {"type": "integer", "minimum": 0, "maximum": 1000},
            "passed": {"type": "boolean"},
        },
        "required": ["name", "score", "passed"],
        "additionalProperties": False,
    },
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "records (bench)": RECORDS_SCHEMA,
    "small object": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "year": {"type": "integer"}},
        "required": ["city", "year"],
    },
    "nested, anyOf, 20 fields": {
        "type": "object",
        "properties": {
            **{f"field_{i}": {"type": ["string", "integer", "null"]} for i in range(16)},
            "address": {
                "type": "object",
                "properties": {"street": {"type": "string"}, "zip": {"pattern": "^[0-9]{5}$"}},
            },
            "contact": {"anyOf": [{"type": "string", "format": "email"}, {"type": "null"}]},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
            "score": {"type": "number"},
        },
        "required": ["field_0", "address"],
    },
}


def prompts(num_streams: int) -> list[list[dict[str, str]]]:
    return [
        [
            {
                "role": "user",
                "content": f"List eight students of class {index} with their test scores "
                "as a JSON array of {name, score, passed}.",
            }
        ]
        for index in range(num_streams)
    ]


async def run_round(
    client: openai.AsyncOpenAI, model: str, conversations: list[Any], lengths: list[int] | None
) -> tuple[float, list[int]]:
    """Seconds for every stream at once, and each one's output tokens. ``lengths`` None:
    constrained; otherwise unconstrained with exactly those lengths."""

    async def one(index: int) -> int:
        extra: dict[str, Any]
        if lengths is None:
            extra = {"structured_outputs": {"json": RECORDS_SCHEMA}}
            max_tokens = 600
        else:
            extra = {"ignore_eos": True}
            max_tokens = lengths[index]
        response = await client.chat.completions.create(
            model=model,
            messages=conversations[index],
            temperature=1.0,
            seed=index,
            max_tokens=max_tokens,
            extra_body=extra,
        )
        choice = response.choices[0]
        if lengths is None:
            assert choice.finish_reason == "stop", choice
            jsonschema.validate(json.loads(choice.message.content or ""), RECORDS_SCHEMA)
        assert response.usage is not None
        return response.usage.completion_tokens

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(index) for index in range(len(conversations))))
    return time.perf_counter() - start, list(counts)


async def measure(base_url: str, num_streams: int, repeats: int) -> None:
    conversations = prompts(num_streams)
    async with openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=600
    ) as client:
        model = (await client.models.list()).data[0].id
        await run_round(client, model, conversations[:2], None)  # warm-up
        constrained: list[float] = []
        unconstrained: list[float] = []
        for _ in range(repeats):
            seconds, lengths = await run_round(client, model, conversations, None)
            constrained.append(seconds)
            seconds, counts = await run_round(client, model, conversations, lengths)
            assert counts == lengths
            unconstrained.append(seconds)
    tokens = sum(lengths)
    fast, slow = tokens / min(constrained), tokens / min(unconstrained)
    print(f"{num_streams} streams, {tokens} output tokens a round (same seeds each round)")
    print(f"constrained:   {fast:7.1f} tok/s  (runs {_runs(constrained)})")
    print(f"unconstrained: {slow:7.1f} tok/s  (runs {_runs(unconstrained)})")
    print(f"ratio constrained / unconstrained: {fast / slow:.3f} (goal >= 0.9)")


def compile_times() -> None:
    from metrale_config import read_gguf_header
    from metrale_model_arch import Tokenizer, resolve_model
    from metrale_server.structured import GrammarCompiler, StructuredOutputsParams

    tokenizer = Tokenizer.from_gguf_fields(read_gguf_header(resolve_model(None).path).fields)
    start = time.perf_counter()
    GrammarCompiler(tokenizer, tokenizer.vocab_size).compile(StructuredOutputsParams(regex="a"))
    print(f"compiler set-up + first grammar: {(time.perf_counter() - start) * 1e3:.1f} ms")
    for name, schema in SCHEMAS.items():
        cold = []
        for _ in range(5):
            compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size)
            compiler.compile(StructuredOutputsParams(regex="warm"))
            start = time.perf_counter()
            compiler.compile(StructuredOutputsParams(json=schema))
            cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        compiler.compile(StructuredOutputsParams(json=schema))
        cached = time.perf_counter() - start
        print(
            f"compile {name:26s} cold {statistics.median(cold) * 1e3:7.2f} ms (median of 5), "
            f"cached {cached * 1e6:6.1f} us"
        )


def wait_for_compiled_steps(base_url: str, timeout_s: float = 300.0) -> None:
    """Until ``/v1/server`` says the compiled layer steps serve (they compile after ready)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = httpx.get(f"{base_url}/v1/server", timeout=5).json().get("layer_steps")
        if state != "compiling":
            print(f"layer steps: {state}")
            return
        time.sleep(0.5)
    raise TimeoutError("the layer steps did not finish compiling")


def _runs(seconds: list[float]) -> str:
    return ", ".join(f"{s:.2f} s" for s in seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(cpu_line())
    compile_times()
    server = ServerProcess.start(["--max-batch-size", str(args.streams)])
    try:
        server.wait_ready(timeout_s=300)
        wait_for_compiled_steps(server.base_url)
        asyncio.run(measure(server.base_url, args.streams, args.repeats))
    finally:
        exit_code = server.stop(timeout_s=60)
    assert exit_code == 0, server.log_text()


if __name__ == "__main__":
    main()
