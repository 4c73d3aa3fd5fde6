"""Routed experts on CPU: ms per ``fused_moe`` call vs a loop over tokens, SmolLM-MoE-like shapes.

Run: ``python packages/metrale-kernels/benches/fused_moe_cpu.py [--dtype bfloat16]``.
A benchmark, not a test: it prints one line per token count and asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.nn import functional

from metrale_kernels import fused_moe, softmax_topk_routing

NUM_EXPERTS = 8
TOP_K = 2
HIDDEN = 576
INTER = 1536
TOKEN_COUNTS = (1, 16, 256)


def naive_moe(
    hidden: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Each token through each of its experts, one matrix-vector product at a time."""
    out = torch.zeros_like(hidden)
    for token in range(hidden.shape[0]):
        for k in range(topk_ids.shape[1]):
            expert = int(topk_ids[token, k])
            gate, up = (w_gate_up[expert] @ hidden[token]).chunk(2)
            expert_out = w_down[expert] @ (functional.silu(gate) * up)
            out[token] += topk_weights[token, k].to(hidden.dtype) * expert_out
    return out


MoeOp = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]


def median_ms(op: MoeOp, inputs: tuple[torch.Tensor, ...], min_seconds: float) -> float:
    for _ in range(2):
        op(*inputs)
    timings: list[float] = []
    started = time.perf_counter()
    while len(timings) < 5 or time.perf_counter() - started < min_seconds:
        tick = time.perf_counter()
        op(*inputs)
        timings.append(time.perf_counter() - tick)
    return statistics.median(timings) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(0)
    w_gate_up = (torch.randn(NUM_EXPERTS, 2 * INTER, HIDDEN, generator=generator) * 0.02).to(dtype)
    w_down = (torch.randn(NUM_EXPERTS, HIDDEN, INTER, generator=generator) * 0.02).to(dtype)
    print(
        f"fused_moe, {NUM_EXPERTS} experts top-{TOP_K}, hidden {HIDDEN} inter {INTER}, "
        f"{args.dtype}, {torch.get_num_threads()} threads"
    )
    for num_tokens in TOKEN_COUNTS:
        hidden = torch.randn(num_tokens, HIDDEN, generator=generator).to(dtype)
        logits = torch.randn(num_tokens, NUM_EXPERTS, generator=generator)
        weights, ids = softmax_topk_routing(logits, TOP_K, renormalize=True)
        inputs = (hidden, w_gate_up, w_down, weights, ids)
        fused = median_ms(fused_moe, inputs, args.min_seconds)
        naive = median_ms(naive_moe, inputs, args.min_seconds)
        print(
            f"tokens {num_tokens:4d}  fused {fused:9.3f} ms  token loop {naive:9.3f} ms  "
            f"ratio {naive / fused:6.1f}x"
        )


if __name__ == "__main__":
    main()
