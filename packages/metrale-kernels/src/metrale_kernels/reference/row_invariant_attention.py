"""Paged attention in torch ops whose result for a query row depends on its own context alone:
the reference backend's path on the CPU, row-invariant as the native kernel is.

Every query row (a decode's one, each of a prefill's) attends a span of its sequence's keys
that is a function of the row alone: from its first visible key rounded down to a multiple of
``SPAN_QUANTUM`` to its last rounded up, the keys outside its view masked. Rows of one sequence
with the same span share one matmul, its rows padded to the machine's row tile
(:func:`~metrale_kernels.row_invariant.matmul_row_tile`), so each row's scores and sums are
computed the same way whatever else is in the step.

In bfloat16 a row is instead one query of torch's CPU flash attention over its own keys, the
call transformers' sdpa makes for a decode step (:func:`flash_row_attention`): scores, softmax
and sums in float32, the exponentials rounded to bfloat16 before they weigh the values.
"""

from __future__ import annotations

import functools

import attrs
import torch
from torch.nn import functional

from metrale_kernels.attention_metadata import AttentionMetadata
from metrale_kernels.reference.kv_quantization import gather_blocks
from metrale_kernels.reference.paged_attention import (
    check_cache_shape,
    check_sliding_window,
    first_visible,
    group_size,
)
from metrale_kernels.row_invariant import matmul_row_tile, padded_rows

SPAN_QUANTUM = 16
# Floats per vector of torch's CPU kernels, by the capability they run at.
_FLOAT_LANES = {"AVX512": 16, "AVX2": 8}
# The path runs on the CPU only: its plans (built from the host metadata) live there.
HOST = torch.device("cpu")


@attrs.frozen(kw_only=True, eq=False)
class SpanGroup:
    """Query rows of one sequence that attend the same key span ``[start, start + width)``."""

    seq: int
    rows: torch.Tensor  # (rows,) int64: their token indices in q / out
    start: int
    width: int
    visible: torch.Tensor  # (rows, width) bool: the keys each row attends


def plan_span_groups(
    metadata: AttentionMetadata, sliding_window: int | None
) -> tuple[SpanGroup, ...]:
    check_sliding_window(sliding_window)
    groups: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    token = 0
    for seq, (query_len, seq_len) in enumerate(
        zip(metadata.query_lens, metadata.seq_lens, strict=True)
    ):
        for position in range(seq_len - query_len, seq_len):
            first = first_visible(position, sliding_window)
            start = first // SPAN_QUANTUM * SPAN_QUANTUM
            width = -(-(position + 1 - start) // SPAN_QUANTUM) * SPAN_QUANTUM
            groups.setdefault((seq, start, width), []).append((token, first, position + 1))
            token += 1
    planned = []
    for (seq, start, width), members in groups.items():
        key_pos = torch.arange(start, start + width, device=HOST)[None, :]
        firsts = torch.tensor([first for _, first, _ in members], device=HOST)[:, None]
        ends = torch.tensor([end for _, _, end in members], device=HOST)[:, None]
        planned.append(
            SpanGroup(
                seq=seq,
                rows=torch.tensor([row for row, _, _ in members], dtype=torch.int64, device=HOST),
                start=start,
                width=width,
                visible=(key_pos >= firsts) & (key_pos < ends),
            )
        )
    return tuple(planned)


@functools.cache
def flash_lanes() -> int:
    """Floats per vector in torch's CPU flash attention here; 1 where unknown (then every row
    is given exactly its own keys: still a decode step's call, one per key count)."""
    return _FLOAT_LANES.get(torch.backends.cpu.get_cpu_capability(), 1)


@attrs.frozen(kw_only=True, eq=False)
class FlashGroup:
    """Query rows of one sequence whose keys start at ``start`` and number the same whole
    vectors of ``flash_lanes()``: each attends ``[start, start + width)``, the keys past its
    own masked."""

    seq: int
    rows: torch.Tensor  # (rows,) int64: their token indices in q / out
    start: int
    width: int
    visible: torch.Tensor  # (rows, 1, 1, width) bool: the keys each row attends


def plan_flash_groups(
    metadata: AttentionMetadata, sliding_window: int | None
) -> tuple[FlashGroup, ...]:
    check_sliding_window(sliding_window)
    lanes = flash_lanes()
    groups: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    token = 0
    for seq, (query_len, seq_len) in enumerate(
        zip(metadata.query_lens, metadata.seq_lens, strict=True)
    ):
        for position in range(seq_len - query_len, seq_len):
            first = first_visible(position, sliding_window)
            num_keys = position + 1 - first
            groups.setdefault((seq, first, num_keys // lanes), []).append((token, num_keys))
            token += 1
    planned = []
    for (seq, start, num_vectors), members in groups.items():
        width = (num_vectors + 1) * lanes - 1
        counts = torch.tensor([count for _, count in members], device=HOST)[:, None]
        planned.append(
            FlashGroup(
                seq=seq,
                rows=torch.tensor([row for row, _ in members], dtype=torch.int64, device=HOST),
                start=start,
                width=width,
                visible=(torch.arange(width, device=HOST)[None, :] < counts)[:, None, None, :],
            )
        )
    return tuple(planned)


def flash_row_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,
) -> torch.Tensor:
    """Each row of ``q`` as transformers' sdpa attends a decode step's one query on the CPU.

    NOTE: torch's flash kernel exponentiates a row's scores a vector at a time with a fast
    approximation and the keys past its last whole vector with ``std::exp``, and its matmuls
    round a lone query row differently from several: a row's result depends on how many keys it
    is given and on being alone in its (batch, head). So every row is a batch entry of its own,
    over a key count with as many whole vectors as its visible keys (the rest masked: masked
    keys change no sum), which is what a decode step of transformers computes."""
    plan = metadata.derived(("flash_rows", sliding_window), plan_flash_groups, sliding_window)
    for group in plan:
        num_rows = group.rows.shape[0]
        # (kv_heads, width, dim), expanded to every row without a copy.
        keys = _span(k_cache, metadata, group.seq, group.start, group.width).to(q.dtype)
        values = _span(v_cache, metadata, group.seq, group.start, group.width).to(q.dtype)
        attended = functional.scaled_dot_product_attention(
            q.index_select(0, group.rows).unsqueeze(2),
            keys.expand(num_rows, -1, -1, -1),
            values.expand(num_rows, -1, -1, -1),
            attn_mask=group.visible,
            scale=scale,
            enable_gqa=True,
        )
        out.index_copy_(0, group.rows, attended.squeeze(2))
    return out


def _span(
    cache: torch.Tensor, metadata: AttentionMetadata, seq: int, start: int, width: int
) -> torch.Tensor:
    """Keys ``[start, start + width)`` of ``seq`` as ``(kv_heads, width, dim)`` (dequantized
    from a quantized cache); slots past its context are zeros (never the cache's padding, which
    may hold anything)."""
    block_size = metadata.block_size
    stop = min(start + width, metadata.seq_lens[seq])
    first_block, last_block = start // block_size, (stop - 1) // block_size
    blocks = metadata.block_tables[seq, first_block : last_block + 1]
    keys = gather_blocks(cache, blocks).flatten(0, 1)
    keys = keys[start - first_block * block_size : stop - first_block * block_size]
    if stop - start < width:
        keys = torch.cat((keys, keys.new_zeros((start + width - stop, *keys.shape[1:]))))
    return keys.transpose(0, 1)


def row_invariant_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    *,
    out: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``q (tokens, heads, dim)`` over the paged caches; ``out`` (or a new tensor) returned.

    ``softcap`` (gemma2, which no kernel backend computes): scores become
    ``softcap * tanh(scores / softcap)`` before the mask, and the softmax runs in float32, as
    transformers' eager attention does. ``sinks`` (gpt-oss, ``(heads,)``): one more logit per
    head in each row's softmax, whose probability is dropped (the row's weights sum below one);
    the softmax runs in float32 too."""
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    group = group_size(num_heads, num_kv_heads)
    check_cache_shape(q, k_cache, v_cache)
    if out is None:
        out = torch.empty_like(q)
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and softcap is None and sinks is None:
        return flash_row_attention(q, k_cache, v_cache, metadata, scale, sliding_window, out)
    tile = matmul_row_tile(q.dtype) or 1
    plan = metadata.derived(
        ("row_invariant_spans", sliding_window), plan_span_groups, sliding_window
    )
    for span in plan:
        keys = _span(k_cache, metadata, span.seq, span.start, span.width).to(q.dtype)
        values = _span(v_cache, metadata, span.seq, span.start, span.width).to(q.dtype)
        num_rows = span.rows.shape[0]
        # (kv_heads, rows * group, dim): query head h reads kv head h // group.
        query = q.index_select(0, span.rows).view(num_rows, num_kv_heads, group, head_dim)
        query = query.permute(1, 0, 2, 3).reshape(num_kv_heads, num_rows * group, head_dim)
        padded = padded_rows(num_rows * group, tile)
        if padded != num_rows * group:
            query = torch.cat(
                (query, query.new_zeros((num_kv_heads, padded - query.shape[1], head_dim))), 1
            )
        scores = torch.bmm(query, keys.transpose(1, 2)).mul_(scale)
        if softcap is not None:
            scores = scores.div_(softcap).tanh_().mul_(softcap)
        hidden = ~span.visible.repeat_interleave(group, 0)
        scores[:, : num_rows * group].masked_fill_(hidden, float("-inf"))
        if sinks is not None:
            sink = _sink_column(sinks, num_kv_heads, num_rows, scores.shape[1])
            scores = torch.cat((scores.float(), sink), -1)
            probs = torch.softmax(scores, dim=-1)[..., :-1].to(q.dtype)
        elif softcap is None:
            probs = torch.softmax(scores, dim=-1)
        else:
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        attended = torch.bmm(probs, values)[:, : num_rows * group]
        attended = attended.view(num_kv_heads, num_rows, group, head_dim).permute(1, 0, 2, 3)
        out.index_copy_(0, span.rows, attended.reshape(num_rows, num_heads, head_dim))
    return out


def _sink_column(
    sinks: torch.Tensor, num_kv_heads: int, num_rows: int, padded: int
) -> torch.Tensor:
    """``(kv_heads, padded, 1)`` float32: query row ``r * group + g`` of kv head ``k`` is head
    ``k * group + g`` and takes its sink; the padding rows take zeros."""
    column = sinks.float().view(num_kv_heads, -1).repeat(1, num_rows)
    return torch.nn.functional.pad(column, (0, padded - column.shape[1]))[..., None]
