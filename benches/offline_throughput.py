"""Offline throughput of the engine against HF transformers ``generate`` on the same requests.

    python benches/offline_throughput.py [--quick] [--num-requests 64] [--sweep] [--profile]

A serving-shaped load on the bundled default model, CPU: prompt lengths drawn from
64..256 tokens and output lengths from 16..256 (seeded), ``ignore_eos`` so every system makes
exactly the requested tokens. Throughput = requested output tokens / wall time. The engine runs
as ``LLM()`` with its defaults (what a user gets with no flags: on a CPU with AVX2 or better,
int8 weights and native (else compiled) layer steps, timed once ready; ``--eager``
and ``--quantization`` override); ``--sweep`` also runs explicit
``max_batch_size`` x ``max_batch_tokens`` settings and prints defaults / best. The baseline is
HF ``generate`` in static batches (arrival order, left padding, each batch runs until its
longest request is done; only requested tokens count), at batch 16 and 64, the better one.
``--profile`` splits the engine's step time into host work (scheduling, input preparation,
sampling, engine-core update, output processing) and the forward pass. Also printed: the
machine's sgemm FLOP/s, int8 ``_int_mm`` OP/s and copy bandwidth, the engine's whole-run
matmul FLOP/s as a fraction of the fastest matmul path of its weight format (sgemm for float32,
``_int_mm`` for int8 and q4), and its batch-1 decode weight bytes/s as a fraction of copy bandwidth.
"""

from __future__ import annotations

import argparse
import functools
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from metrale_model_arch.memory import param_counts
from metrale_server import LLM, SamplingParams
from metrale_server.engine.layer_compiler import LayerCompiler


def make_requests(
    num_requests: int, prompt_range: tuple[int, int], output_range: tuple[int, int], seed: int
) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(1000, 40000) for _ in range(rng.randint(*prompt_range))],
            rng.randint(*output_range),
        )
        for _ in range(num_requests)
    ]


def sgemm_flops(size: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def int8_matmul_ops(rows: int = 512, k: int = 576, n: int = 1536, repeats: int = 20) -> float:
    """Int8 x int8 -> int32 OP/s of ``torch._int_mm`` at the default model's MLP shape."""
    a = torch.randint(-127, 128, (rows, k), dtype=torch.int8)
    b = torch.randint(-127, 128, (n, k), dtype=torch.int8).t()
    torch._int_mm(a, b)
    start = time.perf_counter()
    for _ in range(repeats):
        torch._int_mm(a, b)
    return 2 * rows * k * n * repeats / (time.perf_counter() - start)


def copy_bandwidth(num_bytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Bytes read plus written per second by a large tensor copy (best of ``repeats``).

    Both buffers are written first: untouched pages all map the zero page and read from cache.
    """
    src = torch.randn(num_bytes // 4)
    dst = torch.ones_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * num_bytes / best


def run_engine(llm: LLM, requests: list[tuple[list[int], int]]) -> float:
    prompts = [{"prompt_token_ids": ids} for ids, _ in requests]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    for output, (_, n) in zip(outputs, requests, strict=True):
        assert output.error is None, output.error
        assert len(output.outputs[0].token_ids) == n
    return elapsed


def run_hf(
    model: Any, requests: list[tuple[list[int], int]], batch_size: int, pad_id: int
) -> float:
    start = time.perf_counter()
    for first in range(0, len(requests), batch_size):
        batch = requests[first : first + batch_size]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.int64)
        mask = torch.zeros((len(batch), width), dtype=torch.int64)
        for row, (ids, _) in enumerate(batch):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            mask[row, width - len(ids) :] = 1
        longest = max(n for _, n in batch)
        with torch.inference_mode():
            model.generate(
                input_ids,
                attention_mask=mask,
                max_new_tokens=longest,
                min_new_tokens=longest,
                do_sample=False,
                pad_token_id=pad_id,
            )
    return time.perf_counter() - start


def profile_host_work(llm: LLM) -> dict[str, float]:
    """Wrap the engine's stages with timers (seconds summed per stage, read after a run)."""
    totals: dict[str, float] = defaultdict(float)
    engine = llm.engine
    runner = engine.core.runner

    def timed(owner: Any, name: str, stage: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                totals[stage] += time.perf_counter() - start

        setattr(owner, name, wrapper)

    timed(engine.core.scheduler, "schedule", "scheduling")
    timed(runner, "prepare_inputs", "input preparation")
    timed(runner, "forward", "forward incl. input preparation")
    timed(runner, "execute", "runner total")
    timed(engine.core, "_update", "core update")
    timed(engine.processor, "process", "output processing")
    timed(engine.core, "step", "core step")
    timed(engine, "step", "engine step")
    return totals


def print_profile(totals: dict[str, float], num_steps: int) -> None:
    step = totals["engine step"]
    forward = totals["forward incl. input preparation"] - totals["input preparation"]
    sampling = totals["runner total"] - totals["forward incl. input preparation"]
    rows = {
        "scheduling": totals["scheduling"],
        "input preparation": totals["input preparation"],
        "sampling": sampling,
        "core update": totals["core update"],
        "output processing": totals["output processing"],
    }
    print(f"profile over {num_steps} steps, {step:.1f} s in Engine.step:")
    print(f"  forward pass and logits: {forward:.2f} s = {forward / step:.1%}")
    for name, seconds in rows.items():
        print(f"  {name}: {seconds:.2f} s = {seconds / step:.1%}")
    host = sum(rows.values()) - rows["sampling"]
    print(f"  host work without sampling: {host / step:.1%} of the step (goal < 10%)")
    print(f"  host work with sampling: {sum(rows.values()) / step:.1%} of the step")


def _rates(runs: list[float]) -> str:
    return ", ".join(f"{rate:.1f}" for rate in runs)


def decode_weight_bandwidth(llm: LLM, num_tokens: int) -> float:
    """Batch-1 decode: weight bytes streamed per second (every weight read once per token)."""
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [1000, 2000, 3000, 4000]}], params)  # warm
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": [1000, 2000, 3000, 4000]}], params)
    elapsed = time.perf_counter() - start
    return llm.engine.plan.weights.total() * num_tokens / elapsed


def matmul_params(llm: LLM) -> int:
    """Weights multiplied per token: the layers' projections and the head."""
    config = llm.engine.loaded.config
    counts = param_counts(config)
    return counts.layers_int8_weights + config.vocab_size * config.hidden_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small load, under a minute")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--sweep", action="store_true", help="also run explicit settings")
    parser.add_argument("--profile", action="store_true", help="host work vs forward pass")
    parser.add_argument("--hf-batch-sizes", default="64")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eager", action="store_true", help="LLM(enforce_eager=True)")
    parser.add_argument("--quantization", default="auto", help="LLM(quantization=...)")
    args = parser.parse_args()

    if args.quick:
        requests = make_requests(16, (64, 128), (16, 48), args.seed)
        hf_batch_sizes = [16]
    else:
        requests = make_requests(args.num_requests, (64, 256), (16, 256), args.seed)
        hf_batch_sizes = [int(b) for b in args.hf_batch_sizes.split(",")]
    num_output = sum(n for _, n in requests)
    num_prompt = sum(len(ids) for ids, _ in requests)
    print(
        f"threads: {torch.get_num_threads()}  requests: {len(requests)}  "
        f"prompt tokens: {num_prompt}  output tokens: {num_output}"
    )

    sgemm = sgemm_flops()
    int8_ops = int8_matmul_ops()
    bandwidth = copy_bandwidth()
    print(
        f"machine: sgemm {sgemm / 1e9:.1f} GFLOP/s, int8 _int_mm {int8_ops / 1e9:.1f} GOP/s, "
        f"copy {bandwidth / 1e9:.1f} GB/s"
    )

    overrides: dict[str, Any] = {"quantization": args.quantization}
    if args.eager:
        overrides["enforce_eager"] = True
    llm = LLM(**overrides)  # the defaults a user gets, unless overridden
    engine = llm.engine
    compiler = engine.core.compiler
    compiled = compiler is not None and compiler.wait()
    quantization = engine.loaded.quantization
    steps = LayerCompiler.state(compiler, engine.loaded.model)
    print(
        f"LLM() defaults: weights {quantization}, {steps} layer steps"
        f"{f' (compiled in {compiler.seconds:.1f} s)' if compiler and compiled else ''}, "
        f"max_batch_size {engine.max_batch_size}, max_batch_tokens "
        f"{engine.args.max_batch_tokens}, {engine.num_kv_blocks} KV blocks, "
        f"prefix caching {'on' if engine.args.enable_prefix_caching else 'off'}"
    )
    # q4 multiplies int8 activation digits by 4-bit blocks: the int8 products' path too
    int8_products = quantization in ("int8", "q4")
    peak, peak_name = (int8_ops, "_int_mm") if int8_products else (sgemm, "sgemm")
    run_engine(llm, requests[:2])  # warm-up
    totals = profile_host_work(llm) if args.profile else None
    steps_before = engine.stats.num_steps
    elapsed = run_engine(llm, requests)
    ours = num_output / elapsed
    num_steps = engine.stats.num_steps - steps_before
    flops = 2 * matmul_params(llm) * (num_prompt + num_output)
    print(f"metrale LLM(): {ours:.1f} output tok/s ({elapsed:.1f} s, {num_steps} steps)")
    if totals is not None:
        print_profile(totals, num_steps)
    print(
        f"  whole-run matmul FLOP/s: {flops / elapsed / 1e9:.1f} GFLOP/s = "
        f"{flops / elapsed / peak:.0%} of {peak_name}"
    )
    decode_bw = decode_weight_bandwidth(llm, 16 if args.quick else 64)
    print(
        f"  batch-1 decode weight bytes/s: {decode_bw / 1e9:.1f} GB/s = "
        f"{decode_bw / bandwidth:.0%} of copy bandwidth"
    )
    del llm, engine

    if args.sweep:
        # Interleaved, best of three rounds in rotated order: on a shared machine the load
        # drifts between runs, and a setting measured once can lose to a slower moment.
        settings: dict[str, dict[str, int]] = {
            "defaults": {},
            "max_batch_size 64, max_batch_tokens 512": {
                "max_batch_size": 64,
                "max_batch_tokens": 512,
            },
            "max_batch_size 64, max_batch_tokens 1024": {
                "max_batch_size": 64,
                "max_batch_tokens": 1024,
            },
            "max_batch_size 64, max_batch_tokens 4096": {
                "max_batch_size": 64,
                "max_batch_tokens": 4096,
            },
        }
        engines = {name: LLM(**overrides, **fields) for name, fields in settings.items()}
        for sweep_engine in engines.values():
            if sweep_engine.engine.core.compiler is not None:
                sweep_engine.engine.core.compiler.wait()
        rates: dict[str, list[float]] = {name: [] for name in settings}
        names = list(engines)
        for round_index in range(3):
            # Each round starts one setting later, so none is always first after a pause.
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                run_engine(engines[name], requests[:2])
                rates[name].append(num_output / run_engine(engines[name], requests))
        for name, runs in rates.items():
            print(f"  {name}: {max(runs):.1f} output tok/s (runs: {_rates(runs)})")
        best_explicit = max(max(runs) for name, runs in rates.items() if name != "defaults")
        print(
            f"defaults / best explicit setting: {max(rates['defaults']) / best_explicit:.2f} "
            "(goal >= 0.95)"
        )

    if args.no_baseline:
        return
    import transformers

    from metrale_model_arch import resolve_model

    gguf = resolve_model(None).path
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    pad_id = 0
    best = 0.0
    for batch_size in hf_batch_sizes:
        hf_elapsed = run_hf(hf_model, requests, batch_size, pad_id)
        rate = num_output / hf_elapsed
        best = max(best, rate)
        print(
            f"HF generate, static batch {batch_size}: {rate:.1f} output tok/s ({hf_elapsed:.1f} s)"
        )
    print(f"ratio metrale LLM() / best HF: {ours / best:.2f}x (goal >= 3x)")


if __name__ == "__main__":
    main()
