"""Output tokens/s over HTTP (``met serve`` + ``openai`` streaming) ÷ the offline engine's.

    python benches/http_throughput.py [--quick] [--num-requests 64] [--max-batch-size 64]
        [--quantization auto|none|int8|q4]

The workload: ``--num-requests`` streaming completions sent at once to a ``met serve`` child
process on the bundled default model (a Q4_1 GGUF), CPU, float32 activations, weights in
``--quantization`` (default ``auto``, what ``met serve`` does with no flag: the GGUF's Q4_1
blocks stay q4 where the native cpu kernels run them, else float32, the blocks dequantized),
prompts of random token ids and output lengths drawn from seeded ranges, ``ignore_eos``
(through ``extra_body``) so every request makes exactly its tokens, temperature 0. Then the
same prompts and sampling parameters go through ``metrale_server.LLM`` in this process with
the same engine settings. Both sides are timed once their layer steps are ready (the server's
``/v1/server`` no longer says ``compiling``; the offline engine's compile waited for). Printed
first: the CPU, then each side's weight format, dtype, layer steps and kernels (the server's
as ``/v1/server`` reports them), and whether they match. Throughput = requested output
tokens / wall time (first request sent to last stream closed), the best of ``--repeats``
interleaved runs of each, each after a 2-token warm-up request. Prints both and the ratio
HTTP ÷ offline (goal >= 0.9).
Then one stream alone: its time per output token over HTTP (first to last streamed token)
against the offline engine's batch-1 decode step on the same request (goal: within 15%).
The client runs on the same machine as the server, so on a small box it takes CPU time the
engine would otherwise have.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import httpx
import openai
from bench_host import cpu_line

from metrale_bench.server_process import ServerProcess
from metrale_server import LLM, SamplingParams
from metrale_server.engine.layer_compiler import LayerCompiler

Workload = list[tuple[list[int], int]]


def make_workload(
    num_requests: int, prompt_range: tuple[int, int], output_range: tuple[int, int], seed: int
) -> Workload:
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(1000, 40000) for _ in range(rng.randint(*prompt_range))],
            rng.randint(*output_range),
        )
        for _ in range(num_requests)
    ]


async def _stream_one(client: openai.AsyncOpenAI, model: str, prompt: list[int], n: int) -> int:
    stream = await client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=n,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    num_tokens = 0
    async for chunk in stream:
        if chunk.usage is not None:
            num_tokens = chunk.usage.completion_tokens
    return num_tokens


async def run_http(base_url: str, model: str, workload: Workload) -> float:
    """Seconds from sending every request at once to the last stream's end."""
    async with openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=600
    ) as client:
        await _stream_one(client, model, workload[0][0][:8], 2)  # warm-up
        start = time.perf_counter()
        counts = await asyncio.gather(*(_stream_one(client, model, p, n) for p, n in workload))
        elapsed = time.perf_counter() - start
    assert counts == [n for _, n in workload], "a stream made fewer tokens than asked"
    return elapsed


async def single_stream_tpot(base_url: str, model: str, prompt: list[int], n: int) -> float:
    """Seconds between streamed tokens of one request alone (first to last token)."""
    async with openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=600
    ) as client:
        stream = await client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=n,
            temperature=0.0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        arrivals = [time.perf_counter() async for chunk in stream if chunk.choices]
    return (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)


def offline_decode_step(llm: LLM, prompt: list[int], n: int) -> float:
    """Seconds per batch-1 decode step: the run of ``n`` tokens less the run of one."""

    def run(max_tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], params)
        return time.perf_counter() - start

    return (run(n) - run(1)) / (n - 1)


def run_offline(llm: LLM, workload: Workload) -> float:
    prompts = [{"prompt_token_ids": ids} for ids, _ in workload]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in workload]
    llm.generate([{"prompt_token_ids": workload[0][0][:8]}], SamplingParams(max_tokens=2))
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    for output, (_, n) in zip(outputs, workload, strict=True):
        assert output.error is None, output.error
        assert len(output.outputs[0].token_ids) == n
    return elapsed


def wait_for_server_steps(base_url: str, timeout_s: float = 300.0) -> dict[str, object]:
    """``/v1/server`` once it no longer says its layer steps are ``compiling`` (they compile
    in the background after ready)."""
    deadline = time.monotonic() + timeout_s
    while True:
        info: dict[str, object] = httpx.get(f"{base_url}/v1/server", timeout=5).json()
        if info.get("layer_steps") != "compiling" or time.monotonic() > deadline:
            return info
        time.sleep(0.5)


def offline_info(llm: LLM) -> dict[str, object]:
    """The offline engine's fields named as ``/v1/server`` names them."""
    loaded = llm.engine.loaded
    compiler = llm.engine.core.compiler
    if compiler is not None:
        compiler.wait()
    return {
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "quantization": str(loaded.quantization),
        "layer_steps": LayerCompiler.state(compiler, loaded.model),
        "kernels": loaded.model.backend.describe(),
    }


FORMAT_FIELDS = ("quantization", "dtype", "layer_steps", "kernels")


def _describe(info: dict[str, object]) -> str:
    return ", ".join(f"{field} {info.get(field)}" for field in FORMAT_FIELDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short requests, under a minute")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-prefill-tokens", type=int, default=2048)
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quantization",
        default="auto",
        choices=("auto", "none", "int8", "q4"),
        help="weight format of both sides (auto: met serve's default)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="runs of each (best counts)")
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 2 if args.quick else 3

    if args.quick:
        workload = make_workload(args.num_requests, (16, 64), (8, 32), args.seed)
    else:
        workload = make_workload(args.num_requests, (64, 256), (16, 256), args.seed)
    longest = max(len(ids) + n for ids, n in workload)
    assert longest <= args.max_seq_len, f"raise --max-seq-len to {longest}"
    # Room for every request at once, in whole blocks, and nothing more.
    num_kv_blocks = sum(-(-(len(ids) + n) // 16) for ids, n in workload)
    engine = {
        "dtype": "float32",
        "quantization": args.quantization,
        "device": "cpu",
        "max_batch_size": args.max_batch_size,
        "max_batch_tokens": args.max_prefill_tokens,
        "max_seq_len": args.max_seq_len,
        "num_kv_blocks": num_kv_blocks,
    }
    num_output = sum(n for _, n in workload)
    print(cpu_line())
    print(
        f"requests: {len(workload)}  prompt tokens: {sum(len(ids) for ids, _ in workload)}  "
        f"output tokens: {num_output}  engine: {engine}"
    )

    server = ServerProcess.start(
        [
            "--dtype",
            "float32",
            "--quantization",
            args.quantization,
            "--device",
            "cpu",
            "--max-batch-size",
            str(args.max_batch_size),
            "--max-prefill-tokens",
            str(args.max_prefill_tokens),
            "--max-seq-len",
            str(args.max_seq_len),
            "--num-kv-blocks",
            str(num_kv_blocks),
        ]
    )
    http_times: list[float] = []
    offline_times: list[float] = []
    try:
        server.wait_ready(timeout_s=300)
        model = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused").models.list()
        served = wait_for_server_steps(server.base_url)
        llm = LLM(None, **engine)
        offline = offline_info(llm)
        print(f"served (/v1/server): {_describe(served)}")
        print(f"offline (LLM):       {_describe(offline)}")
        same = all(served.get(field) == offline[field] for field in FORMAT_FIELDS)
        print(f"both sides: {'the same' if same else 'DIFFERENT'} format, dtype and steps")
        # Interleaved, best of N: an idle server costs no CPU, and on a shared machine the
        # fastest run of each is the one least disturbed by others.
        for _ in range(args.repeats):
            http_times.append(asyncio.run(run_http(server.base_url, model.data[0].id, workload)))
            offline_times.append(run_offline(llm, workload))
        single_prompt, single_n = workload[0][0], 64 if args.quick else 128
        served_tpots, offline_steps = [], []
        for _ in range(args.repeats):
            served_tpots.append(
                asyncio.run(
                    single_stream_tpot(server.base_url, model.data[0].id, single_prompt, single_n)
                )
            )
            offline_steps.append(offline_decode_step(llm, single_prompt, single_n))
    finally:
        exit_code = server.stop(timeout_s=60)
    assert exit_code == 0, server.log_text()
    http_rate = num_output / min(http_times)
    offline_rate = num_output / min(offline_times)
    print(f"HTTP:    {http_rate:.1f} output tok/s (runs: {_seconds(http_times)})")
    print(f"offline: {offline_rate:.1f} output tok/s (runs: {_seconds(offline_times)})")
    print(f"ratio HTTP / offline: {http_rate / offline_rate:.2f} (goal >= 0.9)")
    served_tpot, offline_step = min(served_tpots), min(offline_steps)
    print(
        f"1 stream: served TPOT {served_tpot * 1e3:.1f} ms, offline batch-1 step "
        f"{offline_step * 1e3:.1f} ms, ratio {served_tpot / offline_step:.2f} (goal <= 1.15)"
    )


def _seconds(times: list[float]) -> str:
    return ", ".join(f"{t:.1f} s" for t in times)


if __name__ == "__main__":
    main()
