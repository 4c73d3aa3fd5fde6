"""The reference backend: plain torch on any device; the numerics other backends match."""

from __future__ import annotations

import itertools

import torch
from torch.nn import functional

from metrale_kernels.attention_metadata import AttentionMetadata

# Decode rows are batched until their gathered K/V reach this many tokens, so one group's
# copy stays in the CPU caches while SDPA reads it (measured: 2-4k beats one big batch).
DECODE_GROUP_TOKENS = 4096


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _group_size(num_heads: int, num_kv_heads: int) -> int:
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads cannot share {num_kv_heads} kv heads evenly")
    return num_heads // num_kv_heads


def _first_visible(position: int, sliding_window: int | None) -> int:
    """The earliest key position a query at ``position`` attends to."""
    return 0 if sliding_window is None else max(0, position - sliding_window + 1)


class TorchBackend:
    """Reference ops in torch; also the production path on CPU."""

    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.to(torch.float32)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
        return weight * normed.to(x.dtype)

    def apply_rotary(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos_half, sin_half = cos_sin_cache[positions].chunk(2, dim=-1)
        # (tokens, 1, head_dim): one angle per position, shared by every head.
        cos = torch.cat([cos_half, cos_half], dim=-1).unsqueeze(1)
        sin = torch.cat([sin_half, sin_half], dim=-1).unsqueeze(1)
        q_rotated = _rotate(q, cos.to(q.dtype), sin.to(q.dtype))
        return q_rotated, _rotate(k, cos.to(k.dtype), sin.to(k.dtype))

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return functional.silu(gate) * up

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        num_kv_heads, head_dim = k_cache.shape[-2:]
        k_slots = k_cache.view(-1, num_kv_heads, head_dim)
        v_slots = v_cache.view(-1, num_kv_heads, head_dim)
        k_slots.index_copy_(0, slot_mapping, key.to(k_cache.dtype))
        v_slots.index_copy_(0, slot_mapping, value.to(v_cache.dtype))

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        _group_size(q.shape[1], k_cache.shape[2])
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1, got {sliding_window}")
        if metadata.is_decode_only:
            seqs = list(range(metadata.num_seqs))
            return self._decode(q, k_cache, v_cache, metadata, seqs, scale, sliding_window)
        out = torch.empty_like(q)
        starts = list(itertools.accumulate(metadata.query_lens, initial=0))
        decode_seqs = [i for i, query_len in enumerate(metadata.query_lens) if query_len == 1]
        if decode_seqs:
            tokens = torch.tensor([starts[i] for i in decode_seqs], device=q.device)
            queries = q.index_select(0, tokens)
            decoded = self._decode(
                queries, k_cache, v_cache, metadata, decode_seqs, scale, sliding_window
            )
            out.index_copy_(0, tokens, decoded)
        for i, seq_len in enumerate(metadata.seq_lens):
            if metadata.query_lens[i] == 1:
                continue
            seq_tokens = slice(starts[i], starts[i + 1])
            block_table = metadata.block_tables[i]
            out[seq_tokens] = self._prefill(
                q[seq_tokens], k_cache, v_cache, block_table, seq_len, scale, sliding_window
            )
        return out

    def _prefill(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_len: int,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        """One sequence: ``q (query_len, heads, head_dim)`` holds its last query_len tokens."""
        query_len, num_heads, head_dim = q.shape
        block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
        group = _group_size(num_heads, num_kv_heads)
        first_query = seq_len - query_len
        first_key = _first_visible(first_query, sliding_window)
        first_block = first_key // block_size
        block_ids = block_table[first_block : (seq_len - 1) // block_size + 1]
        span = slice(first_key - first_block * block_size, seq_len - first_block * block_size)

        def gather(cache: torch.Tensor) -> torch.Tensor:
            # (kv_heads, group, keys, head_dim); the group dim is a stride-0 view, not a copy.
            context = cache.index_select(0, block_ids).flatten(0, 1)[span].to(q.dtype)
            return context.transpose(0, 1)[:, None].expand(-1, group, -1, -1)

        # (kv_heads, group, query_len, head_dim): query head h reads kv head h // group.
        query = q.reshape(query_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        keys, values = gather(k_cache), gather(v_cache)
        if query_len == seq_len and (sliding_window is None or sliding_window >= seq_len):
            attended = functional.scaled_dot_product_attention(
                query, keys, values, is_causal=True, scale=scale
            )
        else:
            query_pos = torch.arange(first_query, seq_len, device=q.device)[:, None]
            key_pos = torch.arange(first_key, seq_len, device=q.device)[None, :]
            allowed = key_pos <= query_pos
            if sliding_window is not None:
                allowed &= key_pos > query_pos - sliding_window
            attended = functional.scaled_dot_product_attention(
                query, keys, values, attn_mask=allowed, scale=scale
            )
        return attended.permute(2, 0, 1, 3).reshape(query_len, num_heads, head_dim)

    def _decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        seqs: list[int],
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        """One query per sequence: ``q (len(seqs), heads, head_dim)``, row j for ``seqs[j]``.

        Rows are sorted by the number of blocks they read and batched in groups of about
        ``DECODE_GROUP_TOKENS`` gathered tokens, each row padded to the longest of its group.
        """
        block_size = metadata.block_size
        # Per row: the first block it reads, and its keys [lo, hi) counted from that block.
        first_blocks: list[int] = []
        spans: list[tuple[int, int]] = []
        for i in seqs:
            seq_len = metadata.seq_lens[i]
            first_key = _first_visible(seq_len - 1, sliding_window)
            first_blocks.append(first_key // block_size)
            offset = first_blocks[-1] * block_size
            spans.append((first_key - offset, seq_len - offset))
        num_blocks = [-(-hi // block_size) for _, hi in spans]
        order = sorted(range(len(seqs)), key=num_blocks.__getitem__)
        budget_blocks = max(1, DECODE_GROUP_TOKENS // block_size)
        out = torch.empty_like(q)
        start = 0
        while start < len(order):
            stop = start + 1
            while (
                stop < len(order) and num_blocks[order[stop]] * (stop + 1 - start) <= budget_blocks
            ):
                stop += 1
            rows = order[start:stop]
            row_ids = torch.tensor(rows, device=q.device)
            tables = metadata.block_tables.index_select(
                0, torch.tensor([seqs[r] for r in rows], device=q.device)
            )
            attended = self._decode_group(
                q.index_select(0, row_ids),
                k_cache,
                v_cache,
                tables,
                [first_blocks[r] for r in rows],
                [num_blocks[r] for r in rows],
                [spans[r] for r in rows],
                scale,
            )
            out.index_copy_(0, row_ids, attended)
            start = stop
        return out

    def _decode_group(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        first_blocks: list[int],
        num_blocks: list[int],
        spans: list[tuple[int, int]],
        scale: float,
    ) -> torch.Tensor:
        """Attention for one group of decode rows, ``block_tables`` holding their tables.

        Row r reads ``num_blocks[r]`` table entries from ``first_blocks[r]`` on; its keys are
        ``spans[r]``, counted from the first slot of those blocks.
        """
        num_rows, num_heads, head_dim = q.shape
        block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
        device = q.device
        width = max(num_blocks)
        first_columns = torch.tensor(first_blocks, device=device)[:, None]
        last_columns = first_columns + torch.tensor(num_blocks, device=device)[:, None] - 1
        # A shorter row re-reads its own last block rather than its table's padding (which may
        # hold anything); those keys are masked below.
        columns = torch.minimum(first_columns + torch.arange(width, device=device), last_columns)
        block_ids = block_tables.gather(1, columns).flatten()
        num_keys = width * block_size
        # (rows, keys, kv_heads, head_dim): fresh copies, so zeroing padding is safe.
        keys = k_cache.index_select(0, block_ids).view(num_rows, num_keys, num_kv_heads, head_dim)
        values = v_cache.index_select(0, block_ids).view(num_rows, num_keys, num_kv_heads, head_dim)
        mask: torch.Tensor | None = None
        if len(set(spans)) == 1:
            lo, hi = spans[0]
            keys, values = keys[:, lo:hi], values[:, lo:hi]
        else:
            key_pos = torch.arange(num_keys, device=device)[None, :]
            lo_t, hi_t = torch.tensor(spans, device=device).unsqueeze(-1).unbind(1)
            valid = (key_pos >= lo_t) & (key_pos < hi_t)
            # NOTE: a slot past a row's context holds whatever the cache held, NaN included,
            # and a masked score still multiplies its value: zero them (keys before ``lo`` are
            # the row's own, written, tokens).
            tail = slice(min(hi for _, hi in spans), num_keys)
            is_padding = ~valid[:, tail, None, None]
            keys[:, tail].masked_fill_(is_padding, 0)
            values[:, tail].masked_fill_(is_padding, 0)
            mask = valid[:, None, None, :]
        # (rows, kv_heads, group, head_dim): query head h reads kv head h // group.
        query = q.view(num_rows, num_kv_heads, _group_size(num_heads, num_kv_heads), head_dim)
        attended = functional.scaled_dot_product_attention(
            query,
            keys.transpose(1, 2).to(q.dtype),
            values.transpose(1, 2).to(q.dtype),
            attn_mask=mask,
            scale=scale,
        )
        return attended.reshape(num_rows, num_heads, head_dim)
