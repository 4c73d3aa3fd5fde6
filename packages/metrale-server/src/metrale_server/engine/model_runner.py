"""The model runner: a scheduler step in, one forward pass and its sampling, tokens out."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import Protocol

import attrs
import torch

from metrale_kernels import AttentionMetadata
from metrale_model_arch import (
    KvCacheDtype,
    LoadedModel,
    TensorAllocator,
    allocate_kv_cache,
    plain_allocator,
)
from metrale_model_arch.kv_cache import allocate_state_slots
from metrale_model_arch.memory import BUFFER_ARENA, arena_buffers
from metrale_model_arch.parallel import gather_vocab_logits
from metrale_model_arch.registry import cache_specs
from metrale_model_arch.ring_kv_cache import layer_caches_with_rings, ring_windows
from metrale_model_arch.sliding_window_ring import RingLayout, ring_step_cap
from metrale_server.engine.block_table import PersistentBlockTable
from metrale_server.engine.image_step import ImageStep
from metrale_server.engine.prompt_reads import (
    PromptReads,
    PromptRows,
    has_logits_row,
    logprob_rows,
    pair_score,
    pool_rows,
    read_prompts,
)
from metrale_server.engine.ring_views import with_ring_views
from metrale_server.engine.scheduler_step import SchedulerStep
from metrale_server.engine.sequence import Sequence
from metrale_server.engine.step_inputs import StepInputs
from metrale_server.engine.step_positions import rope_step_positions
from metrale_server.engine.step_result import SampledToken, StepResult
from metrale_server.output.outputs import TokenLogprob
from metrale_server.sampling.logprobs import compute_logprob_tensors
from metrale_server.sampling.penalty_state import PenaltyState
from metrale_server.sampling.sampler import sample
from metrale_server.sampling.tensors import (
    SamplingBatch,
    SamplingRow,
    has_penalty,
    prepare_sampling_batch,
)
from metrale_server.speculative import target_probs, verify_greedy, verify_sampled
from metrale_server.speculative.grammar_mask import mask_by_grammar

logger = logging.getLogger(__name__)


class WorkerChannel(Protocol):
    """Rank 0's side of a tensor-parallel group (:mod:`metrale_server.engine.distributed`)."""

    def step(self, inputs: StepInputs) -> AbstractContextManager[None]:
        """Send ``inputs`` to every worker; the forward runs inside, the collectives of no
        other step (or heartbeat) interleaving with it."""
        ...


class ModelRunner:
    """Owns the KV pool and the step arena (each allocated once) and runs steps over them.

    Contract of ``execute``: run the step's chunks through the model (K/V written into the
    pool), sample one token for every sequence in a chunk's ``samplers`` (in step order) and
    return them, with what the step read of prompts (prompt logprobs, pooling states and
    vectors: :mod:`~metrale_server.engine.prompt_reads`); it does not change any sequence.
    Host work per step is O(tokens in the step + sequences in it): block tables live in a
    persistent arena tensor, one row per state slot, updated only where a sequence gained (or
    copied) a block.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        num_blocks: int,
        block_size: int,
        max_batch_tokens: int,
        max_batch_size: int,
        max_seq_len: int,
        allocator: TensorAllocator = plain_allocator,
        seed: int = 0,
        indexer_paged: bool = True,
        kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO,
        workers: WorkerChannel | None = None,
        keep_hidden: bool = False,
        ring: RingLayout | None = None,
    ) -> None:
        """``keep_hidden``: each step's result carries the step's final hidden states (what
        the MTP proposer reads); off, the step keeps none. ``ring``: sliding-window layers keep
        their K/V in a ring per state slot where that saves memory (``ring_step_cap`` is then
        the most tokens a sequence may run in one step)."""
        self.loaded = loaded
        self.keep_hidden = keep_hidden
        # Rank 0 of a tensor-parallel group sends each step's inputs to ``workers``.
        self.workers = workers
        self.world_size = 1 if loaded.shard is None else loaded.shard.world_size
        rank_config = loaded.rank_config
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = loaded.device
        self.vocab_size = loaded.config.vocab_size
        self.eos_token_ids = loaded.eos_token_ids
        self.kv_caches = allocate_kv_cache(
            rank_config,
            num_blocks=num_blocks,
            block_size=block_size,
            dtype=loaded.dtype,
            device=loaded.device,
            allocator=allocator,
            indexer_paged=indexer_paged,
            kv_cache_dtype=kv_cache_dtype,
            ring=ring,
        )
        # Per-sequence state that is not paged (linear attention, a flat indexer, the K/V rings
        # of sliding-window layers), one slot per state slot of the scheduler; nothing for a
        # model without such layers.
        self.seq_states = allocate_state_slots(
            rank_config,
            num_slots=max_batch_size,
            max_seq_len=max_seq_len,
            dtype=loaded.dtype,
            device=loaded.device,
            allocator=allocator,
            indexer_paged=indexer_paged,
            kv_cache_dtype=kv_cache_dtype,
            ring=ring,
        )
        specs = cache_specs(
            rank_config, indexer_paged=indexer_paged, kv_cache_dtype=kv_cache_dtype, ring=ring
        )
        # What each layer's attention reads: the pool's caches, or its ring's.
        self.layer_caches = layer_caches_with_rings(self.kv_caches, self.seq_states, specs)
        self.ring_windows = ring_windows(specs)
        self.ring_step_cap = ring_step_cap(specs)
        dtypes = {"int64": torch.int64, "model": loaded.dtype}
        arena = {
            buffer.name: allocator(BUFFER_ARENA, buffer.shape, dtypes[buffer.dtype], self.device)
            for buffer in arena_buffers(
                rank_config,
                max_batch_tokens=max_batch_tokens,
                max_batch_size=max_batch_size,
                dtype_bytes=loaded.dtype.itemsize,
                max_seq_len=max_seq_len,
                block_size=block_size,
            )
        }
        self._input_ids = arena["input_ids"]
        self._positions = arena["positions"]
        self._slot_mapping = arena["slot_mapping"]
        self._logits = arena["logits"]
        self.block_tables = PersistentBlockTable(arena["block_tables"])
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed)
        # The encoder step of a model that takes images (set by whoever built its cache).
        self.image_step: ImageStep | None = None

    def copy_blocks(self, copies: tuple[tuple[int, int], ...]) -> None:
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], dtype=torch.int64, device=self.device)
        dst = torch.tensor([d for _, d in copies], dtype=torch.int64, device=self.device)
        self.kv_caches.copy_blocks(src, dst)

    def prepare_inputs(
        self, step: SchedulerStep
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int], PromptReads]:
        """Token ids and positions (views of the arena; ``(3, tokens)`` positions, not in the
        arena, for a step holding a sequence with M-RoPE prompt positions:
        :mod:`~metrale_server.engine.step_positions`), the attention metadata, the flat index of
        each sampling chunk's last token (of its last real token and each draft, for a chunk
        with drafts; none for an embedding's), and the prompt positions the step reads."""
        token_ids: list[int] = []
        positions: list[int] = []
        logits_indices: list[int] = []
        rows: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        read_logprobs: list[PromptRows] = []
        read_pools: list[PromptRows] = []
        for chunk in step.chunks:
            seq, start = chunk.seq, chunk.start
            end = start + chunk.num_new_tokens
            flat_start = len(token_ids)
            if (logprob_read := logprob_rows(chunk, flat_start)) is not None:
                read_logprobs.append(logprob_read)
            if (pool_read := pool_rows(chunk, flat_start)) is not None:
                read_pools.append(pool_read)
            if chunk.num_new_tokens == 1:
                token_ids.append(seq.token_ids[start])
                positions.append(start)
            elif chunk.num_draft_tokens:
                token_ids += seq.token_ids[start:]
                token_ids += seq.draft_token_ids
                positions += range(start, end)
            else:
                token_ids += seq.token_ids[start:end]
                positions += range(start, end)
            if has_logits_row(chunk):
                first = len(token_ids) - 1 - chunk.num_draft_tokens
                logits_indices += range(first, len(token_ids))
            rows.append(self.block_tables.sync(seq))
            # Siblings forked in this step: their rows now, their state after the forward.
            for sibling in chunk.samplers[1:]:
                self.block_tables.sync(sibling)
            query_lens.append(chunk.num_new_tokens)
            seq_lens.append(end)
        for slot in self.block_tables.flush():
            if self.seq_states.allocations:
                self.seq_states.reset(slot)
        num_tokens = len(token_ids)
        input_ids = self._input_ids[:num_tokens]
        input_ids.copy_(torch.tensor(token_ids, dtype=torch.int64))
        position_ids = self._positions[:num_tokens]
        host_positions = torch.tensor(positions, dtype=torch.int64)
        position_ids.copy_(host_positions)
        rope_positions = rope_step_positions(step, host_positions)
        device = self.device
        rows_t = torch.tensor(rows, dtype=torch.int64, device=device)
        query_lens_t = torch.tensor(query_lens, dtype=torch.int64, device=device)
        width = -(-max(seq_lens) // self.block_size)
        tables = self.block_tables.table.index_select(0, rows_t)[:, :width]
        token_rows = torch.repeat_interleave(torch.arange(len(rows), device=device), query_lens_t)
        blocks = tables[token_rows, position_ids // self.block_size]
        slot_mapping = self._slot_mapping[:num_tokens]
        torch.add(position_ids % self.block_size, blocks, alpha=self.block_size, out=slot_mapping)
        query_start_loc = torch.zeros(len(rows) + 1, dtype=torch.int64, device=device)
        torch.cumsum(query_lens_t, 0, out=query_start_loc[1:])
        metadata = AttentionMetadata(
            slot_mapping=slot_mapping,
            query_start_loc=query_start_loc,
            seq_lens_tensor=torch.tensor(seq_lens, dtype=torch.int64, device=device),
            block_tables=tables,
            query_lens=tuple(query_lens),
            seq_lens=tuple(seq_lens),
            block_size=self.block_size,
            state_slots=rows_t,
        )
        reads = PromptReads(logprob_rows=tuple(read_logprobs), pool_rows=tuple(read_pools))
        if rope_positions is not None:
            position_ids = rope_positions.to(device)
        return input_ids, position_ids, metadata, logits_indices, reads

    @torch.inference_mode()
    def forward(self, step: SchedulerStep) -> tuple[torch.Tensor, StepResult]:
        """One logits row per chunk that samples (in step order; 1 + its drafts for a chunk
        with drafts; none for an embedding's), float32, and what the step read of prompts
        (no tokens yet). The rows live in the arena's logits buffer when they fit (drafts can
        outnumber its rows): valid until the next call."""
        input_ids, positions, metadata, logits_indices, reads = self.prepare_inputs(step)
        embeds = None if self.image_step is None else self.image_step.input_embeds(step, input_ids)
        inputs = StepInputs(
            input_ids=input_ids,
            positions=positions,
            slot_mapping=metadata.slot_mapping,
            query_start_loc=metadata.query_start_loc,
            seq_lens_tensor=metadata.seq_lens_tensor,
            block_tables=metadata.block_tables,
            state_slots=metadata.state_slots,
            query_lens=metadata.query_lens,
            seq_lens=metadata.seq_lens,
            block_size=metadata.block_size,
            logits_indices=tuple(logits_indices),
            block_copies=step.block_copies,
        )
        if self.workers is None:
            result = self._run_and_read(inputs, metadata, reads, embeds)
        else:
            with self.workers.step(inputs.to_host()):
                result = self._run_and_read(inputs, metadata, reads, embeds)
        self._copy_forked_state(step)
        return result

    def _copy_forked_state(self, step: SchedulerStep) -> None:
        """Each sibling forked in ``step`` starts from its parent's per-sequence state (the
        prompt's rings, linear state) as the step left it."""
        if not self.seq_states.allocations:
            return
        for chunk in step.chunks:
            for sibling in chunk.samplers[1:]:
                assert chunk.seq.slot is not None
                assert sibling.slot is not None
                self.seq_states.copy(chunk.seq.slot, sibling.slot)

    def _run_and_read(
        self,
        inputs: StepInputs,
        metadata: AttentionMetadata,
        reads: PromptReads,
        embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, StepResult]:
        hidden = self._hidden_states(inputs, metadata, embeds)
        # NOTE: before the sampled rows' logits: the prompt logprobs use the same buffer.
        read = read_prompts(hidden, reads, self.loaded.model.compute_logits, self._logits)
        if self.keep_hidden:
            read = attrs.evolve(read, hidden=hidden)
        return self._logits_rows(hidden, inputs.logits_indices), read

    @torch.inference_mode()
    def run_step(
        self, inputs: StepInputs, metadata: AttentionMetadata | None = None
    ) -> torch.Tensor:
        """The forward of prepared ``inputs`` (what a tensor-parallel worker runs from rank 0's
        inputs): the whole vocabulary's logits rows, gathered from every rank's part."""
        if metadata is None:
            inputs = inputs.to(self.device)
            metadata = inputs.metadata()
        return self._logits_rows(self._hidden_states(inputs, metadata), inputs.logits_indices)

    def _hidden_states(
        self,
        inputs: StepInputs,
        metadata: AttentionMetadata,
        embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The model's final (normed) hidden state of every token in the step; ``embeds``
        stand for the tokens' embeddings (a step that reaches image tokens)."""
        self.copy_blocks(inputs.block_copies)
        # Only the families that take images take ``inputs_embeds``.
        image_rows = {} if embeds is None else {"inputs_embeds": embeds}
        hidden: torch.Tensor = self.loaded.model(
            inputs.input_ids,
            inputs.positions,
            self.layer_caches,
            with_ring_views(metadata, self.ring_windows),
            self.seq_states,
            **image_rows,
        )
        return hidden

    def _logits_rows(self, hidden: torch.Tensor, logits_indices: tuple[int, ...]) -> torch.Tensor:
        if not logits_indices:
            return hidden.new_empty((0, self.vocab_size), dtype=torch.float32)
        index = torch.tensor(logits_indices, dtype=torch.int64, device=self.device)
        out = (
            self._logits[: len(logits_indices)]
            if len(logits_indices) <= len(self._logits)
            else None
        )
        logits: torch.Tensor = self.loaded.model.compute_logits(hidden[index], out=out)
        if self.world_size > 1:
            logits = gather_vocab_logits(logits, self.world_size)
        return logits.float()

    @torch.inference_mode()
    def execute(self, step: SchedulerStep) -> StepResult:
        all_logits, result = self.forward(step)
        samplers: list[Sequence] = []
        row_logits: list[int] = []
        speculated: list[tuple[Sequence, int]] = []  # (sequence, its first logits row)
        row = 0
        for chunk in filter(has_logits_row, step.chunks):
            if chunk.num_draft_tokens:
                speculated.append((chunk.seq, row))
                row += 1 + chunk.num_draft_tokens
                continue
            pooling = chunk.seq.params.pooling
            if pooling is not None and pooling.score_token_ids is not None:
                score = pair_score(all_logits[row], pooling.score_token_ids)
                result.tokens.append(SampledToken(seq=chunk.seq, token_id=-1, pooled=(score,)))
                row += 1
                continue
            samplers += chunk.samplers
            row_logits += [row] * len(chunk.samplers)
            row += 1
        drafted = [
            token
            for seq, first in speculated
            for token in _isolated(
                seq,
                partial(
                    self._verify, seq, all_logits[first : first + 1 + len(seq.draft_token_ids)]
                ),
            )
        ]
        result.tokens.extend(drafted)
        if not samplers:
            return result
        logits = all_logits
        if row_logits != list(range(all_logits.shape[0])):
            logits = all_logits[torch.tensor(row_logits, device=all_logits.device)]
        result.tokens[:0] = self._sample_isolated(logits, samplers)
        return result

    def _sample_isolated(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[SampledToken]:
        """One token per row. A fault in preparing one row (its grammar mask, its penalties,
        its logit processing) fails that sequence only: when the batch's preparation raises,
        each row is prepared alone to find the faulty ones, and the others are sampled
        together. Preparation draws nothing random, so the rows kept sample as they would
        have."""
        try:
            batch = self._prepare(seqs, logits)
        except Exception:
            logger.exception(
                "preparing %d rows to sample failed; finding the faulty ones", len(seqs)
            )
        else:
            return self._sample(logits, seqs, batch)
        faulty = [
            token
            for row, seq in enumerate(seqs)
            for token in _isolated(seq, partial(self._try_prepare, seq, logits[row : row + 1]))
        ]
        failed = {token.seq.seq_id for token in faulty}
        kept = [row for row, seq in enumerate(seqs) if seq.seq_id not in failed]
        if not kept:
            return faulty
        kept_logits = logits[torch.tensor(kept, device=logits.device)]
        kept_seqs = [seqs[row] for row in kept]
        return self._sample(kept_logits, kept_seqs, self._prepare(kept_seqs, kept_logits)) + faulty

    def _prepare(self, seqs: list[Sequence], logits: torch.Tensor) -> SamplingBatch:
        rows = [self._sampling_row(seq) for seq in seqs]
        return prepare_sampling_batch(rows, logits.shape[1], logits.device)

    def _try_prepare(self, seq: Sequence, logits: torch.Tensor) -> list[SampledToken]:
        """Nothing when ``seq``'s row prepares; its preparation raises otherwise."""
        self._prepare([seq], logits)
        return []

    def _sample(
        self, logits: torch.Tensor, samplers: list[Sequence], batch: SamplingBatch
    ) -> list[SampledToken]:
        sampled = sample(logits, batch, generator=self._generator)
        return [
            SampledToken(
                seq=seq,
                token_id=token_id,
                logprob=(
                    None
                    if logprobs is None
                    else TokenLogprob(
                        token_id=token_id,
                        logprob=logprobs.logprob,
                        top=tuple(zip(logprobs.top_token_ids, logprobs.top_logprobs, strict=True)),
                    )
                ),
            )
            for seq, token_id, logprobs in zip(
                samplers, sampled.token_ids, sampled.logprobs, strict=True
            )
        ]

    def _verify(self, seq: Sequence, logits: torch.Tensor) -> list[SampledToken]:
        """The tokens a sequence with drafts emits: the drafts kept, then one more, with their
        logprobs when the request asks (a drafted request has no logit processing but its
        grammar's mask, so they are the log-softmax of its masked logits, as plain decoding
        reports them)."""
        params = seq.params
        if seq.grammar is not None:
            mask_by_grammar(logits, seq.draft_token_ids, seq.grammar)
        if params.is_greedy:
            emitted = verify_greedy(logits, seq.draft_token_ids)
        else:
            generator = self._generator if seq.generator is None else seq.generator
            emitted = verify_sampled(target_probs(logits, params), seq.draft_token_ids, generator)
        if params.logprobs is None:
            return [SampledToken(seq=seq, token_id=token_id) for token_id in emitted]
        chosen = torch.tensor(emitted, dtype=torch.int64, device=logits.device)
        tensors = compute_logprob_tensors(
            torch.log_softmax(logits[: len(emitted)], dim=-1), chosen, params.logprobs
        )
        return [
            SampledToken(
                seq=seq,
                token_id=token_id,
                logprob=TokenLogprob(
                    token_id=token_id, logprob=logprob, top=tuple(zip(top_ids, top, strict=True))
                ),
            )
            for token_id, logprob, top_ids, top in zip(
                emitted,
                tensors.chosen_logprobs.tolist(),
                tensors.top_token_ids.tolist(),
                tensors.top_logprobs.tolist(),
                strict=True,
            )
        ]

    def _sampling_row(self, seq: Sequence) -> SamplingRow:
        if seq.penalty is None and has_penalty(seq.params):
            seq.penalty = PenaltyState(
                seq.prompt_token_ids, seq.output_token_ids, self.vocab_size, self.device
            )
        return SamplingRow(
            params=seq.params,
            num_output_tokens=seq.num_output_tokens,
            penalty=seq.penalty,
            generator=seq.generator,
            eos_token_ids=self.eos_token_ids,
            grammar=seq.grammar,
        )


def _isolated(seq: Sequence, sample_seq: Callable[[], list[SampledToken]]) -> list[SampledToken]:
    """``sample_seq()``, or one ``fault`` token for ``seq`` when it raises (logged)."""
    try:
        return sample_seq()
    except Exception as error:
        logger.exception("request %s: sampling output %d failed", seq.request_id, seq.index)
        return [SampledToken(seq=seq, token_id=-1, fault=f"sampling failed: {error}")]
