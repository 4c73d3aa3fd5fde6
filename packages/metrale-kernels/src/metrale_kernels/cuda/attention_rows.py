"""The per-step inputs of the paged attention kernel: one row per query token.

Row ``t`` is query token ``t``: its sequence (for the block table) and its position. Its keys
are split every ``SPLIT_KEYS`` from its first visible one, so a row's splits, like every
reduction in the kernel, depend on the row alone: batch-invariant, and the same whether the
token is decoded or part of a prefill chunk.
"""

from __future__ import annotations

import weakref

import attrs
import torch

from metrale_kernels.attention_metadata import AttentionMetadata

SPLIT_KEYS = 256


@attrs.frozen(kw_only=True, eq=False)
class AttentionRows:
    row_seq: torch.Tensor  # (num_tokens,) int32
    row_pos: torch.Tensor  # (num_tokens,) int32
    max_splits: int  # the most splits any row has, for this sliding window


_rows: weakref.WeakKeyDictionary[AttentionMetadata, dict[int | None, AttentionRows]] = (
    weakref.WeakKeyDictionary()
)


def num_splits(num_keys: int) -> int:
    return -(-num_keys // SPLIT_KEYS)


def attention_rows(metadata: AttentionMetadata, sliding_window: int | None) -> AttentionRows:
    """The rows of ``metadata``'s step, built once per step and window (shared by the layers)."""
    by_window = _rows.setdefault(metadata, {})
    rows = by_window.get(sliding_window)
    if rows is None:
        rows = _build(metadata, sliding_window)
        by_window[sliding_window] = rows
    return rows


def _build(metadata: AttentionMetadata, sliding_window: int | None) -> AttentionRows:
    device = metadata.query_start_loc.device
    starts = metadata.query_start_loc
    query_lens = starts[1:] - starts[:-1]
    row_seq = torch.repeat_interleave(
        torch.arange(metadata.num_seqs, device=device),
        query_lens,
        output_size=metadata.num_tokens,
    )
    first_positions = metadata.seq_lens_tensor - query_lens - starts[:-1]
    row_pos = torch.arange(metadata.num_tokens, device=device) + first_positions[row_seq]
    # A row sees the most keys at its sequence's last token.
    window = sliding_window if sliding_window is not None else max(metadata.seq_lens, default=0)
    max_splits = max((num_splits(min(s, window)) for s in metadata.seq_lens), default=0)
    return AttentionRows(
        row_seq=row_seq.to(torch.int32),
        row_pos=row_pos.to(torch.int32),
        max_splits=max_splits,
    )
