"""The MTP proposer: the target's own first multi-token-prediction layer drafts greedily.

The layer reads ``(t_{i+1}, h_i)`` at position ``i``, ``h_i`` the target's final hidden state
there, and its logits predict ``t_{i+2}``. Its K/V live in the draft pool (owner
``draft_kv_pool``, as many blocks as the target's pool, lent per state slot:
:mod:`~metrale_server.speculative.draft_blocks`).

After each target step, ``observe`` runs the layer over the step's positions whose next token
is now known, so a sequence's cache holds every position but its last two tokens'. For a
sequence about to decode it then drafts ``k`` tokens, as vLLM's MTP proposer does: the first
from the last of those rows, each next one by the same layer one position on, over the previous
draft and the layer's own output ``h'`` there. ``propose`` hands the drafts to the scheduler.

A cache starts at the first position the target ran for its sequence (a prefix-cache hit is
never run: the layer attends from there on) and starts again wherever a step's rows do not
continue it (the draft pool was short, or another sequence forked from it). Rows it already
holds are not run again (a rolled-back sequence's step repeats positions the layer cached).

A DSA drafter (GLM-5.3's) keeps its indexer per sequence, in the proposer's own state
(:mod:`~metrale_model_arch.proposer_state`, owner ``proposer_state``), at the sequence's state
slot, positions counted from the cache's start. Folding a token into the indexer's filling
pool cannot be undone by writing it again, so the layer only ever folds the sequence's tokens,
each once: the rows of the pool the draft steps fold into are copied before them and put back
after (``index_kpool`` float32 keys and flag bytes a drafting sequence, a step's temporaries),
so drafts, kept or rejected, leave no trace in the proposer's state.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as SequenceOf
from typing import Protocol, TypeVar

import attrs
import torch

from metrale_kernels import build_attention_metadata
from metrale_model_arch import LoadedModel, TensorAllocator
from metrale_model_arch.kv_cache import allocate_layer_cache
from metrale_model_arch.memory import mtp_cache_spec
from metrale_model_arch.owners import DRAFT_KV_POOL
from metrale_model_arch.proposer_state import ProposerState, allocate_proposer_state
from metrale_server.speculative.draft_blocks import DraftBlocks, DraftingSequence, SlotBlocks


class ObservedSequence(DraftingSequence, Protocol):
    @property
    def is_finished(self) -> bool: ...


SeqT = TypeVar("SeqT", bound=ObservedSequence)
SeqT_co = TypeVar("SeqT_co", bound=ObservedSequence, covariant=True)


class ObservedChunk(Protocol[SeqT_co]):
    """What ``observe`` reads of a step's chunk (the engine's ``ScheduledChunk``)."""

    @property
    def seq(self) -> SeqT_co: ...
    @property
    def start(self) -> int: ...
    @property
    def num_new_tokens(self) -> int: ...
    @property
    def samplers(self) -> SequenceOf[SeqT_co]: ...


@attrs.define(eq=False)
class _MtpCache(SlotBlocks):
    """Positions ``start .. end - 1`` hold the layer's K/V over the sequence's tokens (cache
    row ``position - start``); ``drafts`` follow the sequence's first ``base`` tokens."""

    start: int = 0
    end: int = 0
    base: int = 0
    drafts: tuple[int, ...] = ()


@attrs.define(eq=False)
class _Row:
    """One sequence's run: ``tokens`` over ``hidden`` at positions ``first ..``."""

    cache: _MtpCache
    slot: int
    first: int
    tokens: list[int]
    hidden: torch.Tensor
    num_drafts: int
    drafts: list[int] = attrs.Factory(list)


def check_mtp_model(loaded: LoadedModel) -> None:
    """``ValueError`` naming the flag unless ``loaded`` carries MTP layers it can run."""
    config = loaded.config
    if loaded.model.num_mtp_layers == 0:
        raise ValueError(
            f"--speculative-config method mtp: {config.model_type} at {loaded.source.path} has "
            "no MTP layers (num_nextn_predict_layers is 0, or the family runs none); use "
            "method ngram or draft_model"
        )


class MtpProposer:
    def __init__(
        self,
        loaded: LoadedModel,
        *,
        num_speculative_tokens: int,
        num_slots: int,
        num_blocks: int,
        block_size: int,
        max_seq_len: int,
        allocator: TensorAllocator,
    ) -> None:
        """``allocator`` is the engine's: the layer's cache is charged to ``draft_kv_pool``,
        its per-sequence state (a DSA drafter's) to ``proposer_state``."""
        check_mtp_model(loaded)
        self.model = loaded.model
        self.device = loaded.device
        self.num_speculative_tokens = num_speculative_tokens
        self.vocab_size = loaded.config.vocab_size
        self.kv_caches = allocate_layer_cache(
            mtp_cache_spec(loaded.config),
            num_blocks=num_blocks,
            block_size=block_size,
            dtype=loaded.dtype,
            device=loaded.device,
            owner=DRAFT_KV_POOL,
            allocator=allocator,
        )
        self.state: ProposerState | None = allocate_proposer_state(
            loaded.config,
            num_slots=num_slots,
            max_seq_len=max_seq_len,
            device=loaded.device,
            allocator=allocator,
        )
        self.kpool = loaded.config.dsa.index_kpool if loaded.config.dsa is not None else 1
        self.blocks = DraftBlocks(
            num_slots=num_slots,
            num_blocks=num_blocks,
            block_size=block_size,
            new_cache=lambda ticket: _MtpCache(ticket=ticket),
        )

    @property
    def num_free_blocks(self) -> int:
        return self.blocks.num_free_blocks

    def release(self, seq: DraftingSequence) -> None:
        """``seq`` gives back its slot, and the slot its draft blocks."""
        self.blocks.release(seq)

    def propose(
        self, seqs: SequenceOf[DraftingSequence], num_tokens: SequenceOf[int]
    ) -> list[tuple[int, ...]]:
        """Up to ``num_tokens[i]`` of the drafts ``observe`` made for ``seqs[i]``'s tokens."""
        proposed = []
        for seq, limit in zip(seqs, num_tokens, strict=True):
            cache = self.blocks.find(seq)
            is_current = cache is not None and cache.base == seq.num_tokens
            proposed.append(cache.drafts[:limit] if cache is not None and is_current else ())
        return proposed

    @torch.inference_mode()
    def observe(
        self,
        chunks: SequenceOf[ObservedChunk[SeqT]],
        hidden: torch.Tensor,
        room: Callable[[SeqT], int],
    ) -> None:
        """After a target step over ``chunks`` (its sequences' new tokens appended) with final
        hidden states ``hidden`` (step order): cache the layer over the positions whose next
        token is known, and draft up to ``room(seq)`` tokens for each sequence that can
        decode."""
        rows: list[_Row] = []
        offset = 0
        for chunk in chunks:
            chunk_hidden = hidden[offset : offset + chunk.num_new_tokens]
            offset += chunk.num_new_tokens
            for seq in chunk.samplers or (chunk.seq,):
                row = self._row(seq, chunk.start, chunk_hidden, room)
                if row is not None:
                    rows.append(row)
        if not rows:
            return
        outputs = self._forward(rows, [row.hidden for row in rows])
        drafting = [(row, out) for row, out in zip(rows, outputs, strict=True) if row.num_drafts]
        saved = self._save_filling_pools([row for row in rows if row.num_drafts > 1])
        while drafting:
            tokens = self._argmax(torch.stack([out for _, out in drafting]))
            for (row, _), token in zip(drafting, tokens, strict=True):
                row.drafts.append(token)
            drafting = [(row, out) for row, out in drafting if len(row.drafts) < row.num_drafts]
            for row, _ in drafting:
                row.first, row.tokens = row.first + len(row.tokens), [row.drafts[-1]]
            if drafting:
                going = [row for row, _ in drafting]
                outputs = self._forward(going, [out[None] for _, out in drafting])
                drafting = list(zip(going, outputs, strict=True))
        self._restore_filling_pools(saved)
        for row in rows:
            row.cache.drafts = tuple(row.drafts)

    def _row(
        self,
        seq: SeqT,
        start: int,
        hidden: torch.Tensor,
        room: Callable[[SeqT], int],
    ) -> _Row | None:
        # Positions whose next token is known: all the step ran but a sampled token's.
        end = min(start + hidden.shape[0], seq.num_tokens - 1)
        cache = None if seq.is_finished or end <= start else self.blocks.cache(seq)
        if cache is None:
            return None
        assert seq.slot is not None
        if not cache.start <= start <= cache.end:
            self.blocks.give_back(cache)
            cache.start = cache.end = start
        if cache.end == cache.start and self.state is not None:
            self.state.reset(seq.slot)
        cache.base, cache.drafts = seq.num_tokens, ()
        first = cache.end
        num_drafts = max(room(seq), 0) if end == seq.num_tokens - 1 else 0
        # Each draft after the first caches one more position.
        if first >= end or not self.blocks.grow(cache, end + max(num_drafts - 1, 0) - cache.start):
            return None
        cache.end = end
        return _Row(
            cache=cache,
            slot=seq.slot,
            first=first,
            tokens=seq.token_ids[first + 1 : end + 1],
            hidden=hidden[first - start : end - start],
            num_drafts=num_drafts,
        )

    def _save_filling_pools(
        self, rows: list[_Row]
    ) -> list[tuple[int, slice, torch.Tensor, torch.Tensor]]:
        """Each row's drafter indexer rows of the pool its first draft step folds into."""
        if self.state is None:
            return []
        keys, flags = self.state.indexer
        saved = []
        for row in rows:
            position = row.first + len(row.tokens) - row.cache.start
            pool = position - position % self.kpool
            rows_of_pool = slice(pool, min(pool + self.kpool, keys.shape[1]))
            saved.append(
                (row.slot, rows_of_pool, keys[row.slot, rows_of_pool].clone(),
                 flags[row.slot, rows_of_pool].clone())
            )  # fmt: skip
        return saved

    def _restore_filling_pools(
        self, saved: list[tuple[int, slice, torch.Tensor, torch.Tensor]]
    ) -> None:
        if self.state is None:
            return
        keys, flags = self.state.indexer
        for slot, rows_of_pool, saved_keys, saved_flags in saved:
            keys[slot, rows_of_pool] = saved_keys
            flags[slot, rows_of_pool] = saved_flags

    def _forward(self, rows: list[_Row], hidden: list[torch.Tensor]) -> list[torch.Tensor]:
        """The layer over each row's ``tokens`` from position ``row.first``, after ``hidden``
        (a row each): its output ``h'`` at each row's last token."""
        lengths = [len(row.tokens) for row in rows]
        # NOTE: a DSA drafter's positions count from its cache's start: they align the
        # indexer's pools, and its selections index the cache (GLM-5.3 has no rotary).
        offsets = [row.cache.start if self.state is not None else 0 for row in rows]
        metadata = build_attention_metadata(
            block_tables=[row.cache.blocks for row in rows],
            seq_lens=[
                row.first - row.cache.start + n for row, n in zip(rows, lengths, strict=True)
            ],
            query_lens=lengths,
            block_size=self.blocks.block_size,
            state_slots=[row.slot for row in rows] if self.state is not None else None,
            device=self.device,
        )
        input_ids = torch.tensor([t for row in rows for t in row.tokens], device=self.device)
        positions = torch.tensor(
            [
                p - offset
                for row, n, offset in zip(rows, lengths, offsets, strict=True)
                for p in range(row.first, row.first + n)
            ],
            device=self.device,
        )
        state = self.state.indexer if self.state is not None else ()
        out = self.model.forward_mtp(
            input_ids, torch.cat(hidden), positions, self.kv_caches[0], metadata, state
        )
        ends = torch.tensor(lengths, device=self.device).cumsum(0) - 1
        return list(out[ends].unbind(0))

    def _argmax(self, hidden: torch.Tensor) -> list[int]:
        logits = self.model.compute_mtp_logits(hidden)
        tokens: list[int] = logits[:, : self.vocab_size].argmax(dim=-1).tolist()
        return tokens
