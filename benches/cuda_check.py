"""The cupy backend on a GPU, in one run of a few minutes: correctness, bandwidth, invariance,
end to end.

    python benches/cuda_check.py [--skip-e2e] [--quick]

1. Every kernel against the torch reference on random inputs (``metrale_kernels.testing.parity``:
   ragged batches, GQA ratios, sliding windows, NaN-poisoned unused slots, fp32/fp16/bf16).
2. Decode attention's achieved bytes/s (K and V read once) over the GPU's measured copy
   bandwidth, at 4k..32k context (goal: 80% or more), over a bf16 cache and an int8 one.
3. Batch invariance: the attention kernel's rows alone vs among 7 and 63 other sequences
   (bit-identical), and the default model end to end: one prompt's greedy tokens and top-20
   logprobs alone vs inside batches of 7 and 63 other prompts.
4. The default model end to end: LLM throughput with the cupy backend vs the torch backend on
   the same GPU, and time per output token at batch 1.

Exits 1 when any kernel mismatches or an invariance check fails, 2 without a CUDA device or
CuPy (nothing is verified then).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import TYPE_CHECKING

import torch
from bench_host import cpu_line

if TYPE_CHECKING:
    from metrale_kernels import KernelBackend

DECODE_CONTEXTS = (4096, 8192, 16384, 32768)


def require_gpu() -> None:
    reason = None
    if not torch.cuda.is_available():
        reason = "no CUDA device (torch.cuda.is_available() is False)"
    else:
        try:
            import cupy

            if not cupy.cuda.is_available():
                reason = "cupy sees no CUDA device"
        except ImportError as error:
            reason = f"cannot import cupy ({error})"
    if reason is not None:
        print(f"cuda_check: {reason}: nothing run, nothing verified", file=sys.stderr)
        sys.exit(2)


def copy_bandwidth(num_bytes: int = 2**30, repeats: int = 10) -> float:
    """Bytes read plus written per second by a device-to-device tensor copy (best of runs)."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return 2 * num_bytes / _best_seconds(lambda: dst.copy_(src), repeats)


def _best_seconds(fn: object, repeats: int) -> float:
    assert callable(fn)
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        best = min(best, start.elapsed_time(stop) / 1e3)
    return best


def check_kernels() -> bool:
    from metrale_kernels.testing.parity import run_all

    print("== kernels vs the torch reference")
    results = run_all("cuda")
    for result in results:
        print(result.line())
    failed = [r for r in results if not r.is_ok]
    print(f"{len(results) - len(failed)} of {len(results)} match")
    return not failed


def decode_bandwidth(copy_bytes_per_s: float, quick: bool) -> None:
    from metrale_kernels.cuda.backend import CupyBackend

    print("== decode attention bandwidth (bf16, 32 q heads, 8 kv heads, head_dim 128)")
    print(f"copy bandwidth: {copy_bytes_per_s / 1e9:.0f} GB/s (read + write)")
    backend = CupyBackend()
    contexts = DECODE_CONTEXTS[:2] if quick else DECODE_CONTEXTS
    # The bf16 cache, then an int8 one (rows of 128 values and a 2-byte scale).
    for kv_dtype, row_bytes in ((torch.bfloat16, 2 * 128), (torch.int8, 128 + 2)):
        print(f"-- {str(kv_dtype).removeprefix('torch.')} cache")
        _decode_bandwidth(backend, contexts, kv_dtype, row_bytes, copy_bytes_per_s)


def _decode_bandwidth(
    backend: KernelBackend,
    contexts: tuple[int, ...],
    kv_dtype: torch.dtype,
    row_bytes: int,
    copy_bytes_per_s: float,
) -> None:
    from metrale_kernels.testing.paged_batches import paged_batch

    for context in contexts:
        for batch_size in (1, 16):
            batch = paged_batch(
                seq_lens=[context] * batch_size,
                query_lens=[1] * batch_size,
                num_heads=32,
                num_kv_heads=8,
                head_dim=128,
                dtype=torch.bfloat16,
                device=torch.device("cuda"),
                kv_dtype=kv_dtype,
            )
            seconds = _best_seconds(
                lambda b=batch: backend.paged_attention(
                    b.q, b.k_cache, b.v_cache, b.metadata, 128**-0.5
                ),
                20,
            )
            kv_bytes = 2 * batch_size * context * 8 * row_bytes
            achieved = kv_bytes / seconds
            print(
                f"context {context:>6} batch {batch_size:>3}: {seconds * 1e6:8.1f} us, "
                f"{achieved / 1e9:7.0f} GB/s = {achieved / copy_bytes_per_s:5.1%} of copy"
            )
            del batch


def check_invariance_kernel() -> bool:
    from metrale_kernels.testing.parity import attention_batch_invariance

    print("== batch invariance: attention rows alone vs among 7 and 63 others")
    ok = True
    for dtype, kv_dtype in (
        (torch.bfloat16, None),
        (torch.float16, None),
        (torch.bfloat16, torch.int8),
    ):
        same = attention_batch_invariance(dtype, "cuda", kv_dtype=kv_dtype)
        cache = "" if kv_dtype is None else f" over an {str(kv_dtype).removeprefix('torch.')} cache"
        name = str(dtype).removeprefix("torch.")
        print(f"{name}{cache}: {'bit-identical' if same else 'DIFFERENT'}")
        ok &= same
    return ok


def _requests(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, 40000) for _ in range(rng.randint(32, 512))] for _ in range(count)]


def check_invariance_model(llm: object) -> bool:
    from metrale_server import SamplingParams

    print("== batch invariance, default model, cupy backend: one prompt alone vs in a batch")
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=20)
    prompt = {"prompt_token_ids": _requests(1, 0)[0]}
    seen = []
    for others in (0, 7, 63):
        batch = [prompt] + [{"prompt_token_ids": ids} for ids in _requests(others, others)]
        output = llm.generate(batch, params)[0].outputs[0]  # type: ignore[attr-defined]
        seen.append((list(output.token_ids), repr(output.logprobs)))
        same = seen[-1] == seen[0]
        print(f"alone vs with {others:>2} others: {'bit-identical' if same else 'DIFFERENT'}")
    return all(s == seen[0] for s in seen)


def end_to_end(quick: bool) -> bool:
    from metrale_server import LLM, SamplingParams

    print("== default model end to end (bfloat16 on cuda)")
    num_requests = 32 if quick else 128
    requests = _requests(num_requests, 1)
    lengths = random.Random(2).choices(range(64, 257), k=num_requests)
    ok = True
    for backend in ("cupy", "torch"):
        llm = LLM(device="cuda", kernel_backend=backend, enforce_eager=True)
        print(f"{backend}: {llm.engine.loaded.model.backend.name} backend")  # type: ignore[attr-defined]
        if backend == "cupy":
            ok &= check_invariance_model(llm)
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
        prompts = [{"prompt_token_ids": ids} for ids in requests]
        llm.generate(prompts[:4], params[:4])  # warm-up: kernels compiled, allocator primed
        start = time.perf_counter()
        llm.generate(prompts, params)
        elapsed = time.perf_counter() - start
        print(f"{backend}: {sum(lengths) / elapsed:8.0f} output tokens/s ({num_requests} requests)")
        single = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
        start = time.perf_counter()
        llm.generate([prompts[0]], single)
        tpot = (time.perf_counter() - start) / 128
        print(f"{backend}: batch 1 time per output token {tpot * 1e3:.2f} ms (prefill included)")
        del llm
        torch.cuda.empty_cache()
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer contexts and requests")
    parser.add_argument("--skip-e2e", action="store_true", help="kernels and bandwidth only")
    args = parser.parse_args()
    require_gpu()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(cpu_line())
    ok = check_kernels()
    ok &= check_invariance_kernel()
    decode_bandwidth(copy_bandwidth(), args.quick)
    if not args.skip_e2e:
        ok &= end_to_end(args.quick)
    print("cuda_check:", "all checks passed" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
