"""A quantized KV cache served: the pool's tokens in one budget, and 16-stream throughput, each
``--kv-cache-dtype`` against the model dtype's (``auto``) in the same run.

    python benches/kv_cache_dtype.py [--kv-dtypes int8,fp8] [--quick] [--repeats 3]

Each format is a ``met serve`` child on the bundled default model (SmolLM2-135M, Q4_1 GGUF;
CPU, float32 activations, the GGUF's q4 blocks as ``met serve`` keeps them with no flag), the
KV pool capped at ``--kv-cache-memory-gib`` (the same for every format; 256 batch slots, so the
cap and not the slots bounds the pool). Its ``/memory`` gives
the pool's tokens (``max_kv_tokens``) and bytes a token: printed with the ratio to ``auto``'s
(goal for int8: >= 1.9x). Throughput: ``--streams`` streaming completions at once (prompts of
random token ids, ``--prompt-tokens`` each, ``--output-tokens`` out, ``ignore_eos``, greedy), the
output tokens over the wall time from the first request sent to the last stream closed; the
servers run one at a time, their runs interleaved (``auto``, then each format, ``--repeats``
rounds), the best run of each counts. Prints each format's tokens/s and its ratio to ``auto``'s
(goal: >= 1.0, not lower than the model dtype).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Iterator

import httpx
import openai
from bench_host import cpu_line
from http_throughput import make_workload, run_http

from metrale_bench.server_process import ServerProcess


@contextlib.contextmanager
def served(kv_dtype: str, args: argparse.Namespace) -> Iterator[ServerProcess]:
    server = ServerProcess.start(
        [
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--kv-cache-dtype",
            kv_dtype,
            "--kv-cache-memory-gib",
            str(args.kv_cache_memory_gib),
            "--max-seq-len",
            str(args.prompt_tokens + args.output_tokens + 16),
            "--max-batch-size",
            "256",
        ]
    )
    try:
        server.wait_ready(timeout_s=300)
        yield server
    finally:
        exit_code = server.stop(timeout_s=60)
        assert exit_code == 0, server.log_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-dtypes", default="int8,fp8", help="formats compared with auto")
    parser.add_argument("--quick", action="store_true", help="shorter requests")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=None)
    parser.add_argument("--output-tokens", type=int, default=None)
    parser.add_argument("--kv-cache-memory-gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.prompt_tokens = args.prompt_tokens or (256 if args.quick else 1024)
    args.output_tokens = args.output_tokens or (64 if args.quick else 128)
    formats = ["auto", *args.kv_dtypes.split(",")]
    workload = make_workload(
        args.streams,
        (args.prompt_tokens, args.prompt_tokens),
        (args.output_tokens, args.output_tokens),
        args.seed,
    )
    num_output = args.streams * args.output_tokens
    print(cpu_line())
    print(
        f"{args.streams} streams x ({args.prompt_tokens} prompt + {args.output_tokens} output) "
        f"tokens; KV pool capped at {args.kv_cache_memory_gib} GiB"
    )
    times: dict[str, list[float]] = {name: [] for name in formats}
    memory: dict[str, dict[str, int]] = {}
    for _ in range(args.repeats):
        for name in formats:
            with served(name, args) as server:
                document = httpx.get(f"{server.base_url}/memory", timeout=10).json()
                memory[name] = {
                    "tokens": document["kv_blocks"] * document["block_size"],
                    "bytes_per_token": document["kv_bytes_per_token"],
                    "pool": document["ledger_by_owner"]["kv_pool"],
                    "planned": document["plan_by_owner"]["kv_pool"],
                }
                model = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
                model_id = model.models.list().data[0].id
                times[name].append(asyncio.run(run_http(server.base_url, model_id, workload)))
    base = memory["auto"]
    base_rate = num_output / min(times["auto"])
    for name in formats:
        pool = memory[name]
        rate = num_output / min(times[name])
        runs = ", ".join(f"{t:.1f}" for t in times[name])
        print(
            f"{name:>9}: pool {pool['tokens']} tokens ({pool['tokens'] / base['tokens']:.2f}x), "
            f"{pool['bytes_per_token']} B/token, ledger {pool['pool']} B == plan "
            f"{pool['planned']} B: {pool['pool'] == pool['planned']}; "
            f"{rate:.1f} output tok/s ({rate / base_rate:.2f}x; runs {runs} s)"
        )


if __name__ == "__main__":
    main()
