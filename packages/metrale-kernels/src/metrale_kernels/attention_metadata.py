"""What one forward pass needs to know about the paged KV cache of every sequence in it."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

import attrs
import torch

T = TypeVar("T")


@attrs.frozen(kw_only=True, eq=False)
class AttentionMetadata:
    """The flat view of one step: sequences laid end to end in token order.

    Sequence ``i`` contributes tokens ``query_start_loc[i]:query_start_loc[i+1]``; they are the
    last ``query_lens[i]`` tokens of a context of ``seq_lens[i]`` tokens, whose K/V live in
    the blocks ``block_tables[i]`` (padding entries past the context are never read).
    ``slot_mapping[t]`` is the cache slot (``block * block_size + offset``) token ``t`` writes.
    ``state_slots[i]``, when the step has state kept per sequence rather than paged (linear
    attention, a flat indexer), is the state slot sequence ``i`` reads and updates.
    Build one per step and share it: what a backend derives from it once (the paged attention
    plan, :func:`metrale_kernels.reference.paged_attention.decode_plan`) is cached on it by
    :meth:`derived`, so every layer reuses it. ``window_views``: for a sliding window whose
    layers keep their K/V elsewhere than the paged pool (a ring per sequence), the step as
    those layers address their cache (:meth:`for_window`).
    """

    slot_mapping: torch.Tensor  # (num_tokens,) int64
    query_start_loc: torch.Tensor  # (num_seqs + 1,) int64
    seq_lens_tensor: torch.Tensor  # (num_seqs,) int64
    block_tables: torch.Tensor  # (num_seqs, max_blocks_per_seq) int64
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    block_size: int
    state_slots: torch.Tensor | None = None  # (num_seqs,) int64
    window_views: Mapping[int, AttentionMetadata] = attrs.field(factory=dict, repr=False)
    # Whatever else a backend derives from the step once for all layers: see ``derived``.
    _derived: dict[Hashable, object] = attrs.field(factory=dict, init=False, repr=False)

    def derived(
        self, key: Hashable, build: Callable[[AttentionMetadata, int | None], T], window: int | None
    ) -> T:
        """``build(self, window)``, built on first use under ``key`` and reused by later layers."""
        if key not in self._derived:
            self._derived[key] = build(self, window)
        return self._derived[key]  # type: ignore[return-value]

    def for_window(self, sliding_window: int | None) -> AttentionMetadata:
        """The metadata a layer of ``sliding_window`` writes and reads its cache by: its
        window's view, if it has one, else this."""
        if sliding_window is None:
            return self
        return self.window_views.get(sliding_window, self)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens, default=0)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


def build_attention_metadata(
    *,
    block_tables: Sequence[Sequence[int]],
    seq_lens: Sequence[int],
    query_lens: Sequence[int],
    block_size: int,
    state_slots: Sequence[int] | torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Flatten per-sequence block tables and lengths into the tensors the ops read.

    Raises ``ValueError`` when the lists differ in length (``state_slots`` included, when
    given), a query length is outside ``1..seq_len``, a table has too few blocks for its
    context, or ``block_size < 1``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    if not (len(block_tables) == len(seq_lens) == len(query_lens)):
        raise ValueError("block_tables, seq_lens and query_lens must have one entry per sequence")
    if state_slots is not None and len(state_slots) != len(seq_lens):
        raise ValueError(
            f"state_slots must have one entry per sequence ({len(seq_lens)}), "
            f"got {len(state_slots)}"
        )
    slots: list[int] = []
    starts = [0]
    for table, seq_len, query_len in zip(block_tables, seq_lens, query_lens, strict=True):
        if not 0 < query_len <= seq_len:
            raise ValueError(f"query_len {query_len} must be in 1..seq_len ({seq_len})")
        if len(table) * block_size < seq_len:
            raise ValueError(f"{len(table)} blocks of {block_size} cannot hold {seq_len} tokens")
        for position in range(seq_len - query_len, seq_len):
            slots.append(table[position // block_size] * block_size + position % block_size)
        starts.append(starts[-1] + query_len)
    width = max((len(t) for t in block_tables), default=0)
    padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int64, device=device),
        seq_lens_tensor=torch.tensor(list(seq_lens), dtype=torch.int64, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int64, device=device).reshape(
            len(padded), width
        ),
        query_lens=tuple(int(q) for q in query_lens),
        seq_lens=tuple(int(s) for s in seq_lens),
        block_size=block_size,
        state_slots=(
            None
            if state_slots is None
            else torch.as_tensor(state_slots, dtype=torch.int64, device=device)
        ),
    )
