"""The draft-model proposer: a smaller model with the target's tokenizer drafts greedily.

The draft caches K/V in a paged pool of its own (owner ``draft_kv_pool``) with as many blocks
as the target's pool, lent per state slot (:mod:`~metrale_server.speculative.draft_blocks`).

Drafting ``k`` tokens for a batch of sequences runs ``k`` draft forwards over all of them at
once: the first catches each sequence up on every token the draft has not cached (the prompt,
the drafts verification kept, the token it added), each next one feeds the previous drafts.
The draft's cache then holds every position up to the last draft but one. The next proposal
keeps the cached positions whose tokens verification kept (the drafts that match the
sequence's tokens) and recomputes the rest. A sequence whose blocks the draft pool cannot
hold gets no drafts that step; its output is the same, only slower.

A draft with per-sequence state (linear attention, as GLM-5.3 has) keeps it in state slots of
its own (one per the engine's slot, under ``draft_model``): its state after the sequence's
tokens is checkpointed right after the first draft forward and restored after the last, so the
next proposal starts from the sequence's tokens at the last one (the drafts verification kept
run again), and a slot that changed hands starts from zero.
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceOf

import attrs
import torch

from metrale_kernels import build_attention_metadata
from metrale_model_arch import LoadedModel, TensorAllocator, allocate_kv_cache
from metrale_model_arch.kv_cache import allocate_state_slots
from metrale_model_arch.memory import draft_max_seq_len
from metrale_model_arch.owners import DRAFT_KV_POOL, DRAFT_MODEL, KV_POOL
from metrale_model_arch.state_checkpoints import SlotPosition, allocate_state_checkpoints
from metrale_server.speculative.draft_blocks import DraftBlocks, DraftingSequence, SlotBlocks

# A probe the two tokenizers must split alike (letters, digits, punctuation, non-ASCII).
TOKENIZER_PROBE = "Hello, world! The year 2026 in Zürich: naïve café — 東京 ✓"


@attrs.define(eq=False)
class _SlotCache(SlotBlocks):
    """The draft's cache for the sequence holding a slot at ``ticket``: its ``blocks``, every
    position below ``base`` (the sequence's tokens then), and ``drafts``' positions but the
    last."""

    base: int = 0
    drafts: tuple[int, ...] = ()

    def num_valid(self, seq: DraftingSequence, *, keeps_drafts: bool = True) -> int:
        """Leading positions of ``seq`` whose K/V (and state) this cache holds, never its last
        token; without ``keeps_drafts`` (a draft with state, back at ``base``) none of the
        drafts'."""
        if not keeps_drafts:
            return min(self.base, seq.num_tokens - 1)
        kept = 0
        for draft, token in zip(self.drafts, seq.token_ids[self.base :], strict=False):
            if draft != token:
                break
            kept += 1
        valid = self.base + min(kept, max(len(self.drafts) - 1, 0))
        return min(valid, seq.num_tokens - 1)


@attrs.define(eq=False)
class _Row:
    """One sequence's drafting in a batch: feed ``new`` at positions ``start ..``."""

    cache: _SlotCache
    slot: int
    start: int
    new: list[int]
    num_drafts: int
    drafts: list[int] = attrs.Factory(list)


def draft_allocator(allocator: TensorAllocator) -> TensorAllocator:
    """``allocator`` with the draft's owners: its KV pool under ``draft_kv_pool``, every other
    tensor it allocates (weights, tables) under ``draft_model``."""

    def allocate(
        owner: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return allocator(DRAFT_KV_POOL if owner == KV_POOL else DRAFT_MODEL, shape, dtype, device)

    return allocate


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    """``ValueError`` unless the draft tokenizes as the target does."""
    if draft.tokenizer.vocab_size != target.tokenizer.vocab_size or draft.tokenizer.encode(
        TOKENIZER_PROBE
    ) != target.tokenizer.encode(TOKENIZER_PROBE):
        raise ValueError(
            f"--speculative-config model {draft.source.path} does not share the target's "
            f"tokenizer (vocab {draft.tokenizer.vocab_size} vs {target.tokenizer.vocab_size}, "
            "or different token ids for the same text)"
        )


class DraftModelProposer:
    def __init__(
        self,
        draft: LoadedModel,
        *,
        num_slots: int,
        num_blocks: int,
        max_seq_len: int,
        block_size: int,
        vocab_size: int,
        allocator: TensorAllocator,
    ) -> None:
        """``allocator`` is the engine's (this charges the draft's owners); ``vocab_size``
        the target's: drafts are chosen among its ids only."""
        self.model = draft.model
        self.device = draft.device
        self.block_size = block_size
        self.max_seq_len = draft_max_seq_len(draft.config, max_seq_len)
        self.vocab_size = min(vocab_size, draft.config.vocab_size)
        self.kv_caches = allocate_kv_cache(
            draft.config,
            num_blocks=num_blocks,
            block_size=block_size,
            dtype=draft.dtype,
            device=draft.device,
            allocator=draft_allocator(allocator),
        )
        self.blocks = DraftBlocks(
            num_slots=num_slots,
            num_blocks=num_blocks,
            block_size=block_size,
            new_cache=lambda ticket: _SlotCache(ticket=ticket),
        )
        # NOTE: as the draft pool, whatever the target's layout: the indexer paged.
        self.states = allocate_state_slots(
            draft.config,
            num_slots=num_slots,
            max_seq_len=self.max_seq_len,
            dtype=draft.dtype,
            device=draft.device,
            allocator=draft_allocator(allocator),
        )
        self.checkpoints = allocate_state_checkpoints(
            draft.config,
            seq_states=self.states,
            kv_caches=self.kv_caches,
            num_slots=num_slots,
            block_size=block_size,
            indexer_paged=True,
            allocator=draft_allocator(allocator),
        )
        self.has_state = bool(self.states.allocations)

    @property
    def num_free_blocks(self) -> int:
        return self.blocks.num_free_blocks

    def release(self, seq: DraftingSequence) -> None:
        """``seq`` gives back its slot, and the slot its draft blocks."""
        self.blocks.release(seq)

    @torch.inference_mode()
    def propose(
        self, seqs: SequenceOf[DraftingSequence], num_tokens: SequenceOf[int]
    ) -> list[tuple[int, ...]]:
        """Up to ``num_tokens[i]`` greedy drafts to follow ``seqs[i]``'s tokens (fewer near
        the draft's position limit; none without a slot or draft blocks)."""
        rows: dict[int, _Row] = {}
        for index, (seq, limit) in enumerate(zip(seqs, num_tokens, strict=True)):
            row = self._row(seq, limit)
            if row is not None:
                rows[index] = row
        for step in range(max((row.num_drafts for row in rows.values()), default=0)):
            self._draft_step([row for row in rows.values() if row.num_drafts > step])
            if step == 0 and self.has_state:
                self.checkpoints.save(self._positions(rows, seqs))
        if self.has_state:
            self.checkpoints.restore(self._positions(rows, seqs))
        for index, row in rows.items():
            row.cache.base, row.cache.drafts = seqs[index].num_tokens, tuple(row.drafts)
        return [tuple(rows[i].drafts) if i in rows else () for i in range(len(seqs))]

    def _row(self, seq: DraftingSequence, max_tokens: int) -> _Row | None:
        # Drafting k tokens caches positions up to num_tokens + k - 2, below the draft's limit.
        num_drafts = min(max_tokens, self.max_seq_len - seq.num_tokens + 1)
        cache = self.blocks.cache(seq) if num_drafts >= 1 else None
        if cache is None or not self.blocks.grow(cache, seq.num_tokens + num_drafts - 1):
            return None
        start = cache.num_valid(seq, keeps_drafts=not self.has_state)
        assert seq.slot is not None
        if start == 0 and self.has_state:
            self.states.reset(seq.slot)
        return _Row(
            cache=cache,
            slot=seq.slot,
            start=start,
            new=seq.token_ids[start:],
            num_drafts=num_drafts,
        )

    def _positions(
        self, rows: dict[int, _Row], seqs: SequenceOf[DraftingSequence]
    ) -> list[SlotPosition]:
        """Each row's slot after its sequence's tokens."""
        return [
            SlotPosition(
                slot=row.slot,
                start=seqs[index].num_tokens,
                block_table=row.cache.blocks,
            )
            for index, row in rows.items()
        ]

    def _draft_step(self, rows: list[_Row]) -> None:
        """One draft forward over ``rows``: each feeds its ``new`` tokens and drafts one."""
        metadata = build_attention_metadata(
            block_tables=[row.cache.blocks for row in rows],
            seq_lens=[row.start + len(row.new) for row in rows],
            query_lens=[len(row.new) for row in rows],
            block_size=self.block_size,
            state_slots=[row.slot for row in rows] if self.has_state else None,
            device=self.device,
        )
        input_ids = torch.tensor(
            [t for row in rows for t in row.new], dtype=torch.int64, device=self.device
        )
        positions = torch.tensor(
            [p for row in rows for p in range(row.start, row.start + len(row.new))],
            dtype=torch.int64,
            device=self.device,
        )
        states = self.states if self.has_state else ()
        hidden = self.model(input_ids, positions, self.kv_caches, metadata, states)
        last = torch.tensor(_last_indices([len(row.new) for row in rows]), device=self.device)
        logits = self.model.compute_logits(hidden[last])
        tokens = logits[:, : self.vocab_size].argmax(dim=-1).tolist()
        for row, token in zip(rows, tokens, strict=True):
            row.drafts.append(int(token))
            row.start, row.new = row.start + len(row.new), [int(token)]


def _last_indices(query_lens: list[int]) -> list[int]:
    """The flat index of each row's last token."""
    indices, end = [], 0
    for length in query_lens:
        end += length
        indices.append(end - 1)
    return indices
