"""Decode attention on CPU: ms per ``paged_attention`` call, SmolLM2-like shapes.

Run: ``python packages/metrale-kernels/benches/attention_cpu.py [--dtype bfloat16]``.
A benchmark, not a test: it prints one line per (batch, context) and asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from metrale_kernels import build_attention_metadata, get_backend

NUM_HEADS = 9
NUM_KV_HEADS = 3
HEAD_DIM = 64
BLOCK_SIZE = 16
BATCH_SIZES = (1, 16, 64)
CONTEXT_LENS = (512, 2048)


def time_decode(
    batch: int, context_len: int, dtype: torch.dtype, min_seconds: float
) -> tuple[float, float]:
    """(median, best) ms per decode call, ``batch`` sequences of ``context_len`` cached tokens."""
    generator = torch.Generator().manual_seed(0)
    blocks_per_seq = -(-context_len // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=generator).to(dtype)
    v_cache = torch.randn(shape, generator=generator).to(dtype)
    block_ids = torch.randperm(num_blocks, generator=generator).view(batch, blocks_per_seq)
    metadata = build_attention_metadata(
        block_tables=block_ids.tolist(),
        seq_lens=[context_len] * batch,
        query_lens=[1] * batch,
        block_size=BLOCK_SIZE,
    )
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, generator=generator).to(dtype)
    backend = get_backend("cpu")
    scale = HEAD_DIM**-0.5

    for _ in range(2):
        backend.paged_attention(q, k_cache, v_cache, metadata, scale)
    timings: list[float] = []
    started = time.perf_counter()
    while len(timings) < 5 or time.perf_counter() - started < min_seconds:
        tick = time.perf_counter()
        backend.paged_attention(q, k_cache, v_cache, metadata, scale)
        timings.append(time.perf_counter() - tick)
    return statistics.median(timings) * 1e3, min(timings) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"decode paged_attention, {args.dtype}, {torch.get_num_threads()} threads")
    for batch in BATCH_SIZES:
        for context_len in CONTEXT_LENS:
            median_ms, best_ms = time_decode(batch, context_len, dtype, args.min_seconds)
            print(
                f"batch {batch:3d}  context {context_len:5d}  "
                f"{median_ms:8.3f} ms/call median  {best_ms:8.3f} best"
            )


if __name__ == "__main__":
    main()
