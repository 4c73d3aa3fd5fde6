"""CPU micro-benchmark of the GLM-5.3 reference ops, one layer at the real widths.

    python benches/glm5_ops.py [--threads N] [--repeats 3] [--context 4096] [--dtype bfloat16]

The torch references of ``metrale_kernels.reference.kda`` and
``metrale_kernels.reference.dsa``, called directly, on random inputs shaped like one layer of
GLM-5.3 at ``--context`` tokens (default 4096): the baseline later CUDA kernels must beat.
Each line is the median of ``--repeats`` timed calls after one warm-up call:

* KDA (Hl = 64 heads, d = 128): ``short_conv`` over 3*64*128 channels with K = 4, for a
  prefill of the whole context and for one decode token; ``kda_chunked`` (chunk 64) over a
  prefill of the whole context; ``kda_decode_step`` for batch 1 and 16 (one token each).
* Indexer (nI = 32 heads, dI = 128, P = 16, topk 2048 tokens = 128 pools):
  ``pool_index_keys`` of every complete pool of the context; ``index_scores`` and
  ``select_positions`` of a prefill of the whole context (query t at position t) and of one
  decode query at the last position, against every complete pool.
* ``sparse_latent_attention`` (H = 64, R = 512, block size 16, shuffled blocks) over the
  selection of ``select_positions``: one decode query, and ``--prefill-queries`` (default 512)
  queries at the last positions of the context, all with a full selection (topk 2048 + the tail).

``--dtype`` is the activations' and the latent cache's (the ops reduce in float32 whatever it
is; the KDA state is always float32). Throughput counts tokens (or queries) per second.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from bench_host import cpu_line

from metrale_kernels import (
    index_scores,
    kda_chunked,
    kda_decode_step,
    pool_index_keys,
    select_positions,
    short_conv,
    sparse_latent_attention,
)

KDA_HEADS, KDA_DIM, CONV_KERNEL = 64, 128, 4
INDEX_HEADS, INDEX_DIM, KPOOL, INDEX_TOPK = 32, 128, 16, 2048
MLA_HEADS, LATENT_RANK, BLOCK_SIZE = 64, 512, 16


def median_ms(function: Callable[[], object], repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


class Table:
    def __init__(self, repeats: int) -> None:
        self.repeats = repeats
        print(f"{'op':<26} {'what was measured':<58} {'ms/call':>10} {'throughput':>22}")

    def row(
        self, op: str, what: str, function: Callable[[], object], units: float, unit: str
    ) -> None:
        ms = median_ms(function, self.repeats)
        rate = f"{units / ms * 1e3:,.0f} {unit}/s"
        print(f"{op:<26} {what:<58} {ms:>10.2f} {rate:>22}", flush=True)


def unit_rows(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    x = torch.randn(shape, generator=generator)
    return x / x.norm(dim=-1, keepdim=True)


def bench_kda(table: Table, context: int, dtype: torch.dtype, generator: torch.Generator) -> None:
    channels = 3 * KDA_HEADS * KDA_DIM
    weight = torch.randn(channels, CONV_KERNEL, generator=generator) * 0.5
    history = torch.zeros(channels, CONV_KERNEL - 1)
    x = torch.randn(context, channels, generator=generator).to(dtype)
    table.row(
        "short_conv",
        f"prefill {context} tokens x {channels} channels, K={CONV_KERNEL}",
        lambda: short_conv(x, weight, history),
        context,
        "tok",
    )
    table.row(
        "short_conv",
        f"decode 1 token x {channels} channels",
        lambda: short_conv(x[:1], weight, history),
        1,
        "tok",
    )

    def kda_inputs(*shape: int) -> tuple[torch.Tensor, ...]:
        full = (*shape, KDA_HEADS, KDA_DIM)
        q = unit_rows(full, generator) * KDA_DIM**-0.5
        k = unit_rows(full, generator)
        v = torch.randn(full, generator=generator)
        g = -5.0 * torch.sigmoid(torch.randn(full, generator=generator) - 3)
        beta = torch.sigmoid(torch.randn(full[:-1], generator=generator))
        return tuple(t.to(dtype) for t in (q, k, v, g, beta))

    state = torch.zeros(KDA_HEADS, KDA_DIM, KDA_DIM)
    prefill = kda_inputs(context)
    table.row(
        "kda_chunked",
        f"prefill {context} tokens, H={KDA_HEADS} d={KDA_DIM}, chunk 64",
        lambda: kda_chunked(*prefill, state, chunk_size=64),
        context,
        "tok",
    )
    for batch in (1, 16):
        step = kda_inputs(batch)
        states = torch.randn(batch, KDA_HEADS, KDA_DIM, KDA_DIM, generator=generator) * 0.01
        table.row(
            "kda_decode_step",
            f"decode batch {batch} (state {batch} x {KDA_HEADS}x{KDA_DIM}x{KDA_DIM} fp32)",
            lambda step=step, states=states: kda_decode_step(*step, states),
            batch,
            "tok",
        )


def bench_indexer(
    table: Table, context: int, dtype: torch.dtype, generator: torch.Generator
) -> torch.Tensor:
    """Times the indexer ops; returns the prefill's selection ``(context, W)``."""
    num_pools = context // KPOOL
    keys = torch.randn(num_pools, KPOOL, INDEX_DIM, generator=generator).to(dtype)
    gates = torch.randn(num_pools, KPOOL, INDEX_DIM, generator=generator).to(dtype)
    table.row(
        "pool_index_keys",
        f"{num_pools} pools of {KPOOL} ({num_pools * KPOOL} tokens), dI={INDEX_DIM}",
        lambda: pool_index_keys(keys, gates),
        num_pools * KPOOL,
        "tok",
    )
    pooled = pool_index_keys(keys, gates)
    index_q = torch.randn(context, INDEX_HEADS, INDEX_DIM, generator=generator).to(dtype)
    weights = (torch.randn(context, INDEX_HEADS, generator=generator) * INDEX_HEADS**-0.5).to(dtype)
    scale = INDEX_DIM**-0.5
    positions = torch.arange(context)
    topk_pools = INDEX_TOPK // KPOOL
    what = f"{{}} vs {num_pools} pools, nI={INDEX_HEADS} dI={INDEX_DIM}"
    for name, rows in (("prefill", slice(None)), ("decode", slice(context - 1, None))):
        count = len(positions[rows])
        queries = f"{name} {count} quer{'ies' if count > 1 else 'y'}"
        table.row(
            "index_scores",
            what.format(queries),
            lambda rows=rows: index_scores(index_q[rows], weights[rows], pooled, scale),
            count,
            "query",
        )
        scores = index_scores(index_q[rows], weights[rows], pooled, scale)
        table.row(
            "select_positions",
            f"{queries}, P={KPOOL} topk {topk_pools} pools + tail",
            lambda rows=rows, scores=scores: select_positions(
                scores, positions[rows], kpool=KPOOL, topk_pools=topk_pools, select_tail=True
            ),
            count,
            "query",
        )
    scores = index_scores(index_q, weights, pooled, scale)
    return select_positions(scores, positions, kpool=KPOOL, topk_pools=topk_pools, select_tail=True)


def bench_attention(
    table: Table,
    context: int,
    prefill_queries: int,
    selected: torch.Tensor,
    dtype: torch.dtype,
    generator: torch.Generator,
) -> None:
    num_blocks = -(-context // BLOCK_SIZE)
    block_table = torch.randperm(num_blocks, generator=generator)
    cache = torch.randn(num_blocks, BLOCK_SIZE, LATENT_RANK, generator=generator).to(dtype)
    q = torch.randn(context, MLA_HEADS, LATENT_RANK, generator=generator).to(dtype)
    scale = 256**-0.5
    width = selected.shape[1]
    for name, rows in (
        ("decode 1 query", slice(context - 1, None)),
        (f"prefill {prefill_queries} queries", slice(context - prefill_queries, None)),
    ):
        count = len(range(context)[rows])
        picked = int((selected[rows] >= 0).sum()) // count
        table.row(
            "sparse_latent_attention",
            f"{name} at {context} ctx, {picked}/{width} sel, H={MLA_HEADS} R={LATENT_RANK}",
            lambda rows=rows: sparse_latent_attention(
                q[rows], cache, block_table, selected[rows], scale
            ),
            count,
            "query",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--context", type=int, default=4096, help="tokens of the sequence")
    parser.add_argument(
        "--prefill-queries",
        type=int,
        default=512,
        help="queries of the sparse attention prefill (the last ones of the context)",
    )
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 0 < args.prefill_queries <= args.context:
        parser.error("--prefill-queries must be in 1..--context")
    torch.set_num_threads(args.threads)
    print(cpu_line())
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(args.seed)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype} activations, "
        f"context {args.context}, median of {args.repeats} calls after one warm-up"
    )
    if args.prefill_queries < args.context:
        print(
            f"sparse_latent_attention prefill: {args.prefill_queries} queries (positions "
            f"{args.context - args.prefill_queries}..{args.context - 1}), not all {args.context}: "
            "the full prefill takes too long on a small CPU"
        )
    table = Table(args.repeats)
    bench_kda(table, args.context, dtype, generator)
    selected = bench_indexer(table, args.context, dtype, generator)
    bench_attention(table, args.context, args.prefill_queries, selected, dtype, generator)


if __name__ == "__main__":
    main()
