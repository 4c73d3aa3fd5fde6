"""Offline throughput of the engine against HF transformers ``generate`` on the same requests.

    python benches/offline_throughput.py [--quick] [--num-requests 64] [--sweep] [--profile]
        [--compare both|defaults|same-format] [--quantization auto|none|int8|q4]

A serving-shaped load on the bundled default model (SmolLM2-135M-Instruct, a Q4_1 GGUF), CPU:
prompt lengths drawn from 64..256 tokens and output lengths from 16..256 (seeded), ``ignore_eos``
so every system makes exactly the requested tokens. Throughput = requested output tokens / wall
time. The engine runs as ``LLM()`` with its defaults (what a user gets with no flags:
``quantization="auto"`` keeps the checkpoint's format, so the GGUF's Q4_1 blocks stay q4 where
the native cpu kernels run them, else float32; native (else compiled) layer steps, timed once
ready; ``--eager`` and ``--quantization`` override); ``--sweep`` also runs explicit
``max_batch_size`` x ``max_batch_tokens`` settings and prints defaults / best. The baseline is
HF ``generate`` in static batches (arrival order, left padding, each batch runs until its
longest request is done; only requested tokens count), at batch 16 and 64, the better one.

Both sides are warmed up the same way: before each timed run, one untimed run of the first two
requests on the same model (the engine also waits for its layer steps to compile first).

HF transformers cannot run q4: it dequantizes the GGUF to float32. So the default comparison
is not of the same weight format, and each ratio is printed with both sides' formats beside it.
``--compare`` (default ``both``): ``defaults`` times the engine's defaults against HF float32;
``same-format`` times the engine in float32 (``quantization="none"``: the same dequantized
weights HF runs) against it; ``both`` times the defaults and, when they are not float32
already, one more float32 engine run, and prints both ratios.

``--profile`` splits the engine's step time into host work (scheduling, input preparation,
sampling, engine-core update, output processing) and the forward pass. Also printed: the CPU
(model, flags), the machine's sgemm FLOP/s, int8 ``_int_mm`` OP/s and copy bandwidth, the
engine's whole-run matmul FLOP/s as a fraction of the fastest matmul path of its weight format
(sgemm for float32, ``_int_mm`` for int8 and q4), and its batch-1 decode weight bytes/s as a
fraction of copy bandwidth.
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
from bench_host import cpu_line

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


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def checkpoint_weights(llm: LLM) -> str:
    """What the checkpoint stores, e.g. ``the GGUF's Q4_1``."""
    loaded = llm.engine.loaded
    if loaded.source.kind == "gguf":
        stored = "/".join(loaded.config.gguf_projection_types) or "tensors"
        return f"the GGUF's {stored}"
    return f"the checkpoint's {loaded.config.torch_dtype or 'weights'}"


def engine_format(llm: LLM) -> str:
    """The engine's weight format and activation dtype, e.g. ``q4 (the GGUF's Q4_1 blocks
    kept; ...)`` or ``float32 (the GGUF's Q4_1 dequantized)``."""
    loaded = llm.engine.loaded
    dtype = _dtype_name(loaded.dtype)
    stored = checkpoint_weights(llm)
    if loaded.quantization == "q4":
        kept = set(loaded.config.gguf_projection_types) == {"Q4_1"}
        blocks = f"{stored} blocks kept" if kept else f"4-bit blocks from {stored}"
        return f"q4 ({blocks}; int8 embeddings and head; {dtype} activations)"
    if loaded.quantization == "int8":
        return f"int8 (per output row, from {stored}; {dtype} activations)"
    return f"{dtype} ({stored} dequantized)"


def start_engine(overrides: dict[str, Any]) -> LLM:
    """An ``LLM`` whose background layer-step compile, if any, has finished."""
    llm = LLM(**overrides)
    compiler = llm.engine.core.compiler
    if compiler is not None:
        compiler.wait()
    return llm


def timed_engine_run(llm: LLM, requests: list[tuple[list[int], int]]) -> float:
    """Seconds for ``requests``, after the warm-up every timed run here gets (both sides)."""
    run_engine(llm, requests[:2])
    return run_engine(llm, requests)


def timed_hf_run(
    model: Any, requests: list[tuple[list[int], int]], batch_size: int, pad_id: int
) -> float:
    """Seconds for ``requests`` in static batches, after the same warm-up as the engine's."""
    run_hf(model, requests[:2], batch_size, pad_id)
    return run_hf(model, requests, batch_size, pad_id)


def same_format(ours: str, theirs: str) -> str:
    return "the same weight format" if ours == theirs else "different weight formats"


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
    parser.add_argument(
        "--compare",
        choices=("both", "defaults", "same-format"),
        default="both",
        help="against HF float32: the engine's defaults (another weight format, said beside "
        "the ratio), the engine in float32 (quantization none: the same weights), or both",
    )
    args = parser.parse_args()
    if args.compare == "same-format":
        if args.quantization not in ("auto", "none"):
            parser.error("--compare same-format runs quantization none; drop --quantization")
        args.quantization = "none"

    print(cpu_line())
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
    print(
        "warm-up, both sides: one untimed run of the first 2 requests before each timed run "
        "(the engine's layer steps compiled first)"
    )

    sgemm = sgemm_flops()
    int8_ops = int8_matmul_ops()
    bandwidth = copy_bandwidth()
    print(
        f"machine: sgemm {sgemm / 1e9:.1f} GFLOP/s, int8 _int_mm {int8_ops / 1e9:.1f} GOP/s, "
        f"copy {bandwidth / 1e9:.1f} GB/s"
    )

    overrides: dict[str, Any] = {"quantization": args.quantization}
    if args.quantization == "none":
        overrides["dtype"] = "float32"
    if args.eager:
        overrides["enforce_eager"] = True
    llm = start_engine(overrides)  # the defaults a user gets, unless overridden
    engine = llm.engine
    compiler = engine.core.compiler
    quantization = engine.loaded.quantization
    ours_format = engine_format(llm)
    stored = checkpoint_weights(llm)
    steps = LayerCompiler.state(compiler, engine.loaded.model)
    label = "LLM()" if args.quantization == "auto" else f"LLM(quantization={args.quantization!r})"
    print(
        f"{label}: weights {ours_format}, {steps} layer steps"
        f"{f' (compiled in {compiler.seconds:.1f} s)' if compiler and compiler.compiled else ''}, "
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
    print(
        f"metrale {label}, {ours_format}: {ours:.1f} output tok/s "
        f"({elapsed:.1f} s, {num_steps} steps)"
    )
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
    is_float32 = quantization == "none" and engine.loaded.dtype == torch.float32
    llm.close()
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
        engines = {name: start_engine({**overrides, **fields}) for name, fields in settings.items()}
        rates: dict[str, list[float]] = {name: [] for name in settings}
        names = list(engines)
        for round_index in range(3):
            # Each round starts one setting later, so none is always first after a pause.
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                rates[name].append(num_output / timed_engine_run(engines[name], requests))
        for name, runs in rates.items():
            print(f"  {name}: {max(runs):.1f} output tok/s (runs: {_rates(runs)})")
        best_explicit = max(max(runs) for name, runs in rates.items() if name != "defaults")
        print(
            f"defaults / best explicit setting: {max(rates['defaults']) / best_explicit:.2f} "
            "(goal >= 0.95)"
        )
        for sweep_llm in engines.values():
            sweep_llm.close()
        del engines

    if args.no_baseline:
        return

    # The like-for-like run: the engine on the float32 weights HF runs, warmed up the same way.
    ours_float32: tuple[float, str] | None = None
    if args.compare == "both" and not is_float32:
        float32_overrides = {**overrides, "quantization": "none", "dtype": "float32"}
        float32_llm = start_engine(float32_overrides)
        float32_format = engine_format(float32_llm)
        float32_steps = LayerCompiler.state(
            float32_llm.engine.core.compiler, float32_llm.engine.loaded.model
        )
        float32_elapsed = timed_engine_run(float32_llm, requests)
        ours_float32 = (num_output / float32_elapsed, float32_format)
        print(
            f"metrale LLM(quantization='none', dtype='float32'), {float32_format}, "
            f"{float32_steps} layer steps: {ours_float32[0]:.1f} output tok/s "
            f"({float32_elapsed:.1f} s)"
        )
        float32_llm.close()
        del float32_llm

    import transformers

    from metrale_model_arch import resolve_model

    gguf = resolve_model(None).path
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    # What transformers does with any GGUF: every tensor dequantized to the dtype asked for.
    hf_format = f"{_dtype_name(hf_model.dtype)} ({stored} dequantized)"
    pad_id = 0
    best = 0.0
    for batch_size in hf_batch_sizes:
        hf_elapsed = timed_hf_run(hf_model, requests, batch_size, pad_id)
        rate = num_output / hf_elapsed
        best = max(best, rate)
        print(
            f"HF generate {hf_format}, static batch {batch_size}: {rate:.1f} output tok/s "
            f"({hf_elapsed:.1f} s)"
        )
    goal = " (goal >= 3x)" if args.quantization == "auto" else ""
    print(
        f"ratio metrale {label} / best HF: {ours / best:.2f}x{goal}, metrale "
        f"{ours_format} vs HF {hf_format}: {same_format(ours_format, hf_format)}"
    )
    if ours_float32 is not None:
        rate, float32_format = ours_float32
        print(
            f"ratio metrale float32 / best HF: {rate / best:.2f}x, metrale {float32_format} "
            f"vs HF {hf_format}: {same_format(float32_format, hf_format)}"
        )


if __name__ == "__main__":
    main()
