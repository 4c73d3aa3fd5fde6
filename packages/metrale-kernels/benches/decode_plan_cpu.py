"""One decode step on CPU, every layer's paged attention: plan rebuilt per layer vs cached.

Run: ``python packages/metrale-kernels/benches/decode_plan_cpu.py [--dtype bfloat16]``.
"before" gives each layer a fresh copy of the step's metadata (``attrs.evolve``: same tensors,
empty plan cache), so every layer runs ``plan_decode``, as the code did before plans were
cached; "after" gives the step one fresh copy, shared by its layers: the first builds the plan.
A benchmark, not a test: it prints a few lines and asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import attrs
import torch

from metrale_kernels import AttentionMetadata, build_attention_metadata, get_backend
from metrale_kernels.reference.paged_attention import plan_decode

NUM_LAYERS = 30
BATCH = 64
CONTEXT_LENS = (280, 320)  # each sequence's context drawn in this range
NUM_HEADS = 9
NUM_KV_HEADS = 3
HEAD_DIM = 64
BLOCK_SIZE = 16


def make_step(dtype: torch.dtype) -> tuple[AttentionMetadata, torch.Tensor, list[torch.Tensor]]:
    """(metadata, q, per layer k then v cache) of one decode step."""
    generator = torch.Generator().manual_seed(0)
    lo, hi = CONTEXT_LENS
    seq_lens = torch.randint(lo, hi + 1, (BATCH,), generator=generator).tolist()
    blocks = [-(-n // BLOCK_SIZE) for n in seq_lens]
    num_blocks = sum(blocks)
    ids = torch.randperm(num_blocks, generator=generator).tolist()
    tables, used = [], 0
    for n in blocks:
        tables.append(ids[used : used + n])
        used += n
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    caches = [torch.randn(shape, generator=generator).to(dtype) for _ in range(2 * NUM_LAYERS)]
    q = torch.randn(BATCH, NUM_HEADS, HEAD_DIM, generator=generator).to(dtype)

    metadata = build_attention_metadata(
        block_tables=tables, seq_lens=seq_lens, query_lens=[1] * BATCH, block_size=BLOCK_SIZE
    )
    return metadata, q, caches


def time_ms(
    steps: dict[str, Callable[[], object]], min_seconds: float
) -> dict[str, tuple[float, float]]:
    """(median, best) ms per call of each step, the steps taking turns so load drift hits all."""
    for step in steps.values():
        step()
    timings: dict[str, list[float]] = {name: [] for name in steps}
    started = time.perf_counter()
    while min(map(len, timings.values())) < 5 or time.perf_counter() - started < min_seconds:
        for name, step in steps.items():
            tick = time.perf_counter()
            step()
            timings[name].append(time.perf_counter() - tick)
    return {
        name: (statistics.median(times) * 1e3, min(times) * 1e3) for name, times in timings.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--sliding-window", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    window: int | None = args.sliding_window
    base, q, caches = make_step(dtype)
    backend = get_backend("cpu")
    scale = HEAD_DIM**-0.5
    out = torch.empty_like(q)

    def step(rebuild_per_layer: bool) -> None:
        # A new step's metadata: same tensors, empty plan cache (building it is not timed).
        shared = attrs.evolve(base)
        for layer in range(NUM_LAYERS):
            metadata = attrs.evolve(shared) if rebuild_per_layer else shared
            backend.paged_attention(
                q, caches[2 * layer], caches[2 * layer + 1], metadata, scale, window, out=out
            )

    print(
        f"decode step: {NUM_LAYERS} layers, batch {BATCH}, contexts {CONTEXT_LENS[0]}-"
        f"{CONTEXT_LENS[1]}, window {window}, {args.dtype}, {torch.get_num_threads()} threads"
    )
    results = time_ms({"plan_decode, one call": lambda: plan_decode(base, window)}, 1.0)
    steps: dict[str, Callable[[], object]] = {
        "step, plan per layer (before)": lambda: step(True),
        "step, plan cached (after)": lambda: step(False),
    }
    results.update(time_ms(steps, args.min_seconds))
    for name, (median_ms, best_ms) in results.items():
        print(f"{name:32s} {median_ms:8.3f} ms median  {best_ms:8.3f} best")


if __name__ == "__main__":
    main()
