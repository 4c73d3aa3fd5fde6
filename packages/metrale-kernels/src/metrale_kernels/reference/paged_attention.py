"""Reference paged attention: K/V written to and read from block-paged caches.

Everything that depends only on the step (which rows decode, how decode rows are grouped,
which cache blocks each group gathers, the masks) is a :class:`DecodePlan`, built once per
step and sliding window by :func:`decode_plan` (cached on the metadata) and shared by every layer;
a layer only gathers K/V and calls SDPA.
"""

from __future__ import annotations

import itertools

import attrs
import torch
from torch.nn import functional

from metrale_kernels.attention_metadata import AttentionMetadata
from metrale_kernels.reference.kv_quantization import cache_head_dim, gather_blocks, write_slots

# Decode rows are batched until their gathered K/V reach this many tokens, so one group's
# copy stays in the CPU caches while SDPA reads it (measured: 2-4k beats one big batch).
DECODE_GROUP_TOKENS = 4096


@attrs.frozen(kw_only=True, eq=False)
class DecodeGroup:
    """Decode rows attended together, each padded to the longest (in blocks) of the group."""

    tokens: torch.Tensor  # (rows,) int64: the rows of q / out this group reads and writes
    block_ids: torch.Tensor  # (rows * width,) int64: cache blocks to gather, row after row
    num_keys: int  # width * block_size: keys gathered per row
    # Every row's keys are [lo, hi) of its gathered ones: one shared span, else a mask.
    span: tuple[int, int] | None
    mask: torch.Tensor | None  # (rows, 1, 1, num_keys) bool: the keys each row attends
    padding_start: int  # the first gathered key that is past some row's context
    is_padding: torch.Tensor | None  # (rows, num_keys - padding_start, 1, 1) bool


@attrs.frozen(kw_only=True, eq=False)
class PrefillSeq:
    """One sequence with several query tokens, attended on its own."""

    tokens: slice  # its rows of q / out
    block_ids: torch.Tensor  # (blocks,) int64: the cache blocks holding its visible keys
    span: slice  # its visible keys among the gathered ones
    mask: torch.Tensor | None  # (query_len, keys) bool; None: plain causal


@attrs.frozen(kw_only=True, eq=False)
class DecodePlan:
    """What paged attention does for one step and sliding window, whatever the layer."""

    sliding_window: int | None
    decode_groups: tuple[DecodeGroup, ...]
    prefills: tuple[PrefillSeq, ...]


def group_size(num_heads: int, num_kv_heads: int) -> int:
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads cannot share {num_kv_heads} kv heads evenly")
    return num_heads // num_kv_heads


def check_cache_shape(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """The caches hold ``q``'s head dim (quantized or not) and match each other."""
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(
            f"k cache {k_cache.dtype}{tuple(k_cache.shape)} and v cache "
            f"{v_cache.dtype}{tuple(v_cache.shape)} differ"
        )
    if cache_head_dim(k_cache) != q.shape[-1]:
        raise ValueError(
            f"a {k_cache.dtype} cache of rows {k_cache.shape[-1]} holds head dim "
            f"{cache_head_dim(k_cache)}, the query's is {q.shape[-1]}"
        )


def check_sliding_window(sliding_window: int | None) -> None:
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be at least 1, got {sliding_window}")


def first_visible(position: int, sliding_window: int | None) -> int:
    """The earliest key position a query at ``position`` attends to."""
    return 0 if sliding_window is None else max(0, position - sliding_window + 1)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Token ``t``'s key and value ``(tokens, kv_heads, head_dim)`` into slot
    ``slot_mapping[t]`` of the caches, quantized when the caches are
    (:mod:`~metrale_kernels.reference.kv_quantization`)."""
    write_slots(k_cache, slot_mapping, key)
    write_slots(v_cache, slot_mapping, value)


def decode_plan(metadata: AttentionMetadata, sliding_window: int | None) -> DecodePlan:
    """The step's plan for ``sliding_window``, built on first use and cached on ``metadata``:
    every layer of the step shares it. Raises ``ValueError`` when ``sliding_window < 1``."""
    return metadata.derived((decode_plan, sliding_window), _plan_decode, sliding_window)


def _plan_decode(metadata: AttentionMetadata, sliding_window: int | None) -> DecodePlan:
    return plan_decode(metadata, sliding_window)  # looked up when called (tests count calls)


def plan_decode(metadata: AttentionMetadata, sliding_window: int | None) -> DecodePlan:
    """The step's plan: decode rows grouped, every gather index and mask built.

    Pure: reads only ``metadata`` (and ``DECODE_GROUP_TOKENS``). Prefer
    :func:`decode_plan`, which builds it once per metadata and window.
    Raises ``ValueError`` when ``sliding_window < 1``.
    """
    check_sliding_window(sliding_window)
    starts = list(itertools.accumulate(metadata.query_lens, initial=0))
    decode_seqs = [i for i, query_len in enumerate(metadata.query_lens) if query_len == 1]
    prefills = tuple(
        plan_prefill(metadata, i, starts[i], sliding_window)
        for i, query_len in enumerate(metadata.query_lens)
        if query_len != 1
    )
    return DecodePlan(
        sliding_window=sliding_window,
        decode_groups=_plan_decode_groups(metadata, decode_seqs, starts, sliding_window),
        prefills=prefills,
    )


def plan_prefill(
    metadata: AttentionMetadata, seq: int, start: int, sliding_window: int | None
) -> PrefillSeq:
    block_size = metadata.block_size
    device = metadata.block_tables.device
    seq_len, query_len = metadata.seq_lens[seq], metadata.query_lens[seq]
    first_query = seq_len - query_len
    first_key = first_visible(first_query, sliding_window)
    first_block = first_key // block_size
    mask: torch.Tensor | None = None
    if not (query_len == seq_len and (sliding_window is None or sliding_window >= seq_len)):
        query_pos = torch.arange(first_query, seq_len, device=device)[:, None]
        key_pos = torch.arange(first_key, seq_len, device=device)[None, :]
        mask = key_pos <= query_pos
        if sliding_window is not None:
            mask &= key_pos > query_pos - sliding_window
    return PrefillSeq(
        tokens=slice(start, start + query_len),
        block_ids=metadata.block_tables[seq, first_block : (seq_len - 1) // block_size + 1],
        span=slice(first_key - first_block * block_size, seq_len - first_block * block_size),
        mask=mask,
    )


def _plan_decode_groups(
    metadata: AttentionMetadata, seqs: list[int], starts: list[int], sliding_window: int | None
) -> tuple[DecodeGroup, ...]:
    """Decode rows sorted by the number of blocks they read, in groups of about
    ``DECODE_GROUP_TOKENS`` gathered tokens."""
    block_size = metadata.block_size
    device = metadata.block_tables.device
    # Per row: the first block it reads, and its keys [lo, hi) counted from that block.
    first_blocks: list[int] = []
    spans: list[tuple[int, int]] = []
    for i in seqs:
        seq_len = metadata.seq_lens[i]
        first_key = first_visible(seq_len - 1, sliding_window)
        first_blocks.append(first_key // block_size)
        offset = first_blocks[-1] * block_size
        spans.append((first_key - offset, seq_len - offset))
    num_blocks = [-(-hi // block_size) for _, hi in spans]
    order = sorted(range(len(seqs)), key=num_blocks.__getitem__)
    budget_blocks = max(1, DECODE_GROUP_TOKENS // block_size)
    groups: list[DecodeGroup] = []
    start = 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and num_blocks[order[stop]] * (stop + 1 - start) <= budget_blocks:
            stop += 1
        rows = order[start:stop]
        groups.append(
            _plan_decode_group(
                metadata.block_tables.index_select(
                    0, torch.tensor([seqs[r] for r in rows], device=device)
                ),
                torch.tensor([starts[seqs[r]] for r in rows], device=device),
                [first_blocks[r] for r in rows],
                [num_blocks[r] for r in rows],
                [spans[r] for r in rows],
                block_size,
            )
        )
        start = stop
    return tuple(groups)


def _plan_decode_group(
    block_tables: torch.Tensor,
    tokens: torch.Tensor,
    first_blocks: list[int],
    num_blocks: list[int],
    spans: list[tuple[int, int]],
    block_size: int,
) -> DecodeGroup:
    """One group, ``block_tables`` holding its rows' tables.

    Row r reads ``num_blocks[r]`` table entries from ``first_blocks[r]`` on; its keys are
    ``spans[r]``, counted from the first slot of those blocks.
    """
    device = block_tables.device
    width = max(num_blocks)
    first_columns = torch.tensor(first_blocks, device=device)[:, None]
    last_columns = first_columns + torch.tensor(num_blocks, device=device)[:, None] - 1
    # A shorter row re-reads its own last block rather than its table's padding (which may
    # hold anything); those keys are masked.
    columns = torch.minimum(first_columns + torch.arange(width, device=device), last_columns)
    num_keys = width * block_size
    group = DecodeGroup(
        tokens=tokens,
        block_ids=block_tables.gather(1, columns).flatten(),
        num_keys=num_keys,
        span=None,
        mask=None,
        padding_start=num_keys,
        is_padding=None,
    )
    if len(set(spans)) == 1:
        return attrs.evolve(group, span=spans[0])
    key_pos = torch.arange(num_keys, device=device)[None, :]
    lo_t, hi_t = torch.tensor(spans, device=device).unsqueeze(-1).unbind(1)
    valid = (key_pos >= lo_t) & (key_pos < hi_t)
    padding_start = min(hi for _, hi in spans)
    return attrs.evolve(
        group,
        mask=valid[:, None, None, :],
        padding_start=padding_start,
        is_padding=~valid[:, padding_start:, None, None],
    )


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    group_size(q.shape[1], k_cache.shape[2])
    check_cache_shape(q, k_cache, v_cache)
    check_sliding_window(sliding_window)
    plan = decode_plan(metadata, sliding_window)
    if out is None:
        out = torch.empty_like(q)
    for group in plan.decode_groups:
        attended = _decode_group(q.index_select(0, group.tokens), k_cache, v_cache, group, scale)
        out.index_copy_(0, group.tokens, attended)
    for prefill in plan.prefills:
        out[prefill.tokens] = prefill_attention(q[prefill.tokens], k_cache, v_cache, prefill, scale)
    return out


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: PrefillSeq,
    scale: float,
) -> torch.Tensor:
    """One sequence: ``q (query_len, heads, head_dim)`` holds its last query_len tokens."""
    query_len, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = group_size(num_heads, num_kv_heads)

    def gather(cache: torch.Tensor) -> torch.Tensor:
        # (kv_heads, group, keys, head_dim); the group dim is a stride-0 view, not a copy.
        context = gather_blocks(cache, plan.block_ids).flatten(0, 1)[plan.span].to(q.dtype)
        return context.transpose(0, 1)[:, None].expand(-1, group, -1, -1)

    # (kv_heads, group, query_len, head_dim): query head h reads kv head h // group.
    query = q.reshape(query_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    keys, values = gather(k_cache), gather(v_cache)
    attended = functional.scaled_dot_product_attention(
        query, keys, values, attn_mask=plan.mask, is_causal=plan.mask is None, scale=scale
    )
    return attended.permute(2, 0, 1, 3).reshape(query_len, num_heads, head_dim)


def _decode_group(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: DecodeGroup,
    scale: float,
) -> torch.Tensor:
    """Attention for one group of decode rows: ``q (rows, heads, head_dim)``."""
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    shape = (num_rows, plan.num_keys, num_kv_heads, head_dim)
    # (rows, keys, kv_heads, head_dim): fresh copies, so zeroing padding is safe.
    keys = gather_blocks(k_cache, plan.block_ids).view(shape)
    values = gather_blocks(v_cache, plan.block_ids).view(shape)
    if plan.span is not None:
        lo, hi = plan.span
        keys, values = keys[:, lo:hi], values[:, lo:hi]
    elif plan.is_padding is not None:
        # NOTE: a slot past a row's context holds whatever the cache held, NaN included,
        # and a masked score still multiplies its value: zero them (keys before ``lo`` are
        # the row's own, written, tokens).
        keys[:, plan.padding_start :].masked_fill_(plan.is_padding, 0)
        values[:, plan.padding_start :].masked_fill_(plan.is_padding, 0)
    # (rows, kv_heads, group, head_dim): query head h reads kv head h // group.
    query = q.view(num_rows, num_kv_heads, group_size(num_heads, num_kv_heads), head_dim)
    attended = functional.scaled_dot_product_attention(
        query,
        keys.transpose(1, 2).to(q.dtype),
        values.transpose(1, 2).to(q.dtype),
        attn_mask=plan.mask,
        scale=scale,
    )
    return attended.reshape(num_rows, num_heads, head_dim)
