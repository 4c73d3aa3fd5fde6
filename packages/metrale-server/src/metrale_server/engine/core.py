"""``EngineCore``: requests in, one scheduler step at a time, token ids (and logprobs) out."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence as SequenceOf

import attrs

from metrale_model_arch import LoadedModel, PromptPositions
from metrale_model_arch.memory import MemoryPlan
from metrale_server.args import EngineArgs
from metrale_server.engine.block_manager import BlockManager
from metrale_server.engine.core_request import EngineCoreRequest
from metrale_server.engine.distributed.rank_memory import RankMemory
from metrale_server.engine.distributed.tensor_parallel import TensorParallelGroup
from metrale_server.engine.layer_compiler import LayerCompiler
from metrale_server.engine.model_runner import ModelRunner
from metrale_server.engine.prompt_image import PromptImage
from metrale_server.engine.scheduler import Scheduler, SchedulerConfig
from metrale_server.engine.scheduler_step import SchedulerStep
from metrale_server.engine.sequence import Sequence, SequenceStatus
from metrale_server.engine.sequence_group import SequenceGroup
from metrale_server.engine.state_rollback import StateRollback
from metrale_server.engine.stats import EngineStats
from metrale_server.engine.step_result import SampledToken, StepResult
from metrale_server.engine.stop_check import StopReason, check_stop
from metrale_server.memory.ledger import MemoryLedger
from metrale_server.output.core_output import EngineCoreOutput, SequenceDelta
from metrale_server.output.outputs import TokenLogprob
from metrale_server.pooling.model_task import ModelTask
from metrale_server.sampling.output_room import OutputRoomError, fit_max_tokens
from metrale_server.sampling.params import SamplingParams
from metrale_server.sampling.tensors import has_penalty, make_seeded_generator
from metrale_server.speculative import DraftModelProposer, MtpProposer, propose_ngram
from metrale_server.structured import CompiledGrammar, GrammarCompiler, GrammarError

logger = logging.getLogger(__name__)


class SamplingFaultError(RuntimeError):
    """Sampling one sequence's token raised (logged where it did); its request fails."""


class GrammarFaultError(RuntimeError):
    """A grammar cannot go on: it refused a token its own mask allowed, or the grammar engine
    hit one of its limits (the message says which); the request fails with it."""

    def __init__(self, message: str, *, is_request_fault: bool = False) -> None:
        super().__init__(message)
        self.is_request_fault = is_request_fault


class RequestError(ValueError):
    """A request the engine refuses before it runs (it could never fit, or is malformed)."""


@attrs.frozen(kw_only=True, eq=False)
class EngineParts:
    """What an ``EngineCore`` runs on, all built (by
    :func:`~metrale_server.engine.bootstrap.build_engine`): ``args`` with the plan's block size,
    the model loaded through ``ledger``, the runner over the KV pool the plan sized, the other
    ranks (``parallel``) and what each holds, the draft model or MTP proposer, the layer
    compiler."""

    args: EngineArgs
    plan: MemoryPlan
    loaded: LoadedModel
    ledger: MemoryLedger
    task: ModelTask
    runner: ModelRunner
    parallel: TensorParallelGroup | None = None
    rank_memory: tuple[RankMemory, ...] = ()
    draft_proposer: DraftModelProposer | None = None
    mtp_proposer: MtpProposer | None = None
    # Speculation over per-sequence state: checkpoints before a verify step, replay after.
    rollback: StateRollback | None = None
    compiler: LayerCompiler | None = None


class EngineCore:
    """Continuous batching over one paged KV pool; emits token ids, never text.

    Contract: ``add_request`` validates and queues (or raises ``RequestError``, changing
    nothing); ``step`` runs one scheduler step (forward pass and sampling in the runner) and
    returns an ``EngineCoreOutput`` for every request that gained tokens or finished in it;
    ``abort`` ends a request, or some of its outputs (a stop string the output processor
    found), and frees what they hold. Not thread-safe: one thread drives it.
    """

    def __init__(self, parts: EngineParts) -> None:
        """Run on ``parts`` (see :func:`~metrale_server.engine.bootstrap.build_engine`)."""
        self.args = parts.args
        self.plan = parts.plan
        self.loaded = parts.loaded
        self.ledger = parts.ledger
        # What the model serves: generation, or pooling requests of this kind.
        self.task = parts.task
        self.runner = parts.runner
        self.parallel = parts.parallel
        self.rank_memory = parts.rank_memory
        self.draft_proposer = parts.draft_proposer
        self.mtp_proposer = parts.mtp_proposer
        self.rollback = parts.rollback
        self.compiler = parts.compiler
        self.block_size = parts.plan.inputs.block_size
        self.max_seq_len = parts.plan.inputs.max_seq_len
        self.max_batch_size = parts.plan.max_batch_size
        self.num_kv_blocks = parts.plan.kv_blocks
        # A prefix-cache hit skips the prefix's forward, so state kept per sequence rather than
        # in blocks (linear attention, a flat indexer) would start from nothing: off for such
        # models (the boot log says so).
        self.has_sequence_state = bool(self.runner.seq_states.allocations)
        step = self.runner.image_step
        # Each image prefilled within one step (Gemma 3's image tokens attend to each other).
        self._has_whole_images = step is not None and step.encoder.whole_images
        self.prefix_caching = (
            self.args.enable_prefix_caching
            and not self.has_sequence_state
            and self.rollback is None
        )
        self.block_manager = BlockManager(
            self.num_kv_blocks, self.block_size, enable_prefix_caching=self.prefix_caching
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_batch_size=self.max_batch_size,
                max_batch_tokens=self.args.max_batch_tokens,
                max_seq_step_tokens=self.runner.ring_step_cap,
            ),
            self.block_manager,
            proposer=None if self.args.speculative_config is None else self._propose,
            on_release=self._draft_pool_owner(),
        )
        self.eos_token_ids = self.loaded.eos_token_ids
        self._grammar_compiler: GrammarCompiler | None = None
        self._grammar_compiler_lock = threading.Lock()
        self._groups: dict[str, SequenceGroup] = {}
        self._seq_ids = itertools.count()
        self._stats = EngineStats()
        self.published_stats = self.stats

    def close(self) -> None:
        """Stop the tensor-parallel workers (nothing to do for a single-rank engine)."""
        if self.parallel is not None:
            self.parallel.close()
            self.parallel = None

    def publish_stats(self) -> None:
        """Refresh ``published_stats``, the snapshot other threads read (one reference)."""
        self.published_stats = self.stats

    @property
    def stats(self) -> EngineStats:
        """A fresh snapshot (call it on the engine's thread; others read ``published_stats``)."""
        image_step = self.runner.image_step
        return attrs.evolve(
            self._stats,
            num_preemptions=self.scheduler.num_preemptions,
            num_running_seqs=self.scheduler.num_running_seqs,
            num_running_requests=len(self.scheduler.running),
            num_waiting_requests=len(self.scheduler.waiting),
            num_free_kv_blocks=self.block_manager.num_free_blocks,
            num_kv_blocks=self.num_kv_blocks,
            prefix_cache_queries=self.block_manager.stats.num_queried_tokens,
            prefix_cache_hits=self.block_manager.stats.num_hit_tokens,
            num_images_encoded=0 if image_step is None else image_step.counters.num_encoded,
            num_image_cache_hits=0 if image_step is None else image_step.counters.num_cache_hits,
        )

    @property
    def grammar_compiler(self) -> GrammarCompiler:
        """Built on first use (the tokenizer's grammar tables cost time at start); any thread."""
        with self._grammar_compiler_lock:
            if self._grammar_compiler is None:
                self._grammar_compiler = GrammarCompiler(
                    self.loaded.tokenizer, self.loaded.config.vocab_size
                )
            return self._grammar_compiler

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._groups)

    def make_request(
        self,
        request_id: str,
        prompt_token_ids: SequenceOf[int],
        params: SamplingParams,
        *,
        arrival_time: float | None = None,
        grammar: CompiledGrammar | None = None,
        images: SequenceOf[PromptImage] = (),
    ) -> EngineCoreRequest:
        """The request, checked (``RequestError`` for one that can never run). ``grammar`` is
        its constraint compiled by the caller (the server compiles on its preparation threads);
        compiled here (or taken from the cache) when not given. ``images`` stand on the
        prompt's image tokens (:func:`~metrale_server.engine.prompt_image.place_images`); their
        M-RoPE positions, if the model has them, are computed here. Any thread may call it."""
        prompt_ids = tuple(int(t) for t in prompt_token_ids)
        self.check_images(prompt_ids, images)
        if grammar is None:
            grammar = self.compile_grammar(params)
        return EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=prompt_ids,
            params=self.check_request(prompt_ids, params, grammar=grammar),
            grammar=grammar,
            arrival_time=time.monotonic() if arrival_time is None else arrival_time,
            images=tuple(images),
            rope_positions=self.rope_positions(prompt_ids, images),
        )

    def rope_positions(
        self, prompt: tuple[int, ...], images: SequenceOf[PromptImage]
    ) -> PromptPositions | None:
        """The checked prompt's M-RoPE positions, or ``None`` when its tokens sit at their
        indices (a model without them, a prompt without images)."""
        step = self.runner.image_step
        if step is None:
            return None
        try:
            return step.rope_positions(prompt, images)
        except ValueError as error:
            raise RequestError(str(error)) from error

    def check_images(self, prompt: tuple[int, ...], images: SequenceOf[PromptImage]) -> None:
        """``RequestError`` unless the engine takes ``images`` for ``prompt``
        (:meth:`~metrale_server.engine.image_step.ImageStep.check`; a text-only engine none)."""
        step = self.runner.image_step
        if step is None:
            if images:
                raise RequestError(f"{self.loaded.config.model_type}: this server takes no images")
            return
        try:
            step.check(
                prompt,
                images,
                images_per_prompt=self.args.images_per_prompt,
                # A sliding-window ring caps what one sequence runs in a step below the step.
                max_batch_tokens=self.scheduler.config.seq_budget(self.args.max_batch_tokens),
            )
        except ValueError as error:
            raise RequestError(str(error)) from error

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a checked request (:meth:`make_request`); ``RequestError`` when its id is
        running already."""
        request_id, params = request.request_id, request.params
        if request_id in self._groups:
            raise RequestError(f"request id {request_id!r} is already running")
        seqs = [
            Sequence(
                seq_id=next(self._seq_ids),
                request_id=request_id,
                prompt_token_ids=request.prompt_token_ids,
                params=params,
                arrival_time=request.arrival_time,
                index=index,
                generator=(
                    None
                    if params.seed is None
                    else make_seeded_generator(params.seed + index, self.loaded.device)
                ),
                grammar=None if request.grammar is None else request.grammar.matcher(),
                images=request.images,
                whole_images=bool(request.images) and self._has_whole_images,
                rope_positions=request.rope_positions,
            )
            for index in range(params.n)
        ]
        group = SequenceGroup(
            request_id=request_id, seqs=seqs, params=params, arrival_time=request.arrival_time
        )
        self._groups[request_id] = group
        self.scheduler.add(group)

    def check_request(
        self,
        prompt: tuple[int, ...],
        params: SamplingParams,
        *,
        grammar: CompiledGrammar | None = None,
    ) -> SamplingParams:
        """Refuse what can never run; fill ``max_tokens`` when the caller left it open.

        Without ``grammar`` (compiled by the caller), the request's grammar is compiled here
        (and cached), so one that cannot be built is refused.
        """
        if not prompt:
            raise RequestError("the prompt is empty")
        vocab_size = self.loaded.config.vocab_size
        # An image token may lie past the vocabulary (Gemma 3's): its embedding is the image's.
        image_step = self.runner.image_step
        image_token = None if image_step is None else image_step.encoder.image_token_id
        if any(not 0 <= t < vocab_size and t != image_token for t in prompt):
            raise RequestError(f"prompt token ids must be in 0..{vocab_size - 1}")
        if params.pooling is not None:
            if params.n != 1 or params.structured_outputs is not None:
                raise RequestError("a pooling request has one output and no structured_outputs")
            params = attrs.evolve(params, max_tokens=1, logprobs=None, prompt_logprobs=None)
            if len(prompt) > self.max_seq_len:
                raise RequestError(
                    f"the prompt has {len(prompt)} tokens; max_seq_len is {self.max_seq_len}"
                )
            num_tokens = len(prompt)  # it reads its prompt and writes nothing after it
        else:
            params = self._fit_max_tokens(prompt, params)
            assert params.max_tokens is not None
            num_tokens = len(prompt) + params.max_tokens
        if params.prompt_logprobs is not None and self.runner.world_size > 1:
            raise RequestError("prompt_logprobs: not supported with tensor_parallel_size > 1 yet")
        if params.n > self.max_batch_size:
            raise RequestError(f"n ({params.n}) exceeds max_batch_size ({self.max_batch_size})")
        if params.n > 1 and self.has_sequence_state and self.runner.world_size > 1:
            raise RequestError(
                f"n ({params.n}) > 1: forking {self.loaded.config.model_type}'s per-sequence "
                "state on every rank is not built yet (--sliding-window-cache full keeps "
                "sliding-window layers in the KV pool)"
            )
        blocks_per_seq = -(-num_tokens // self.block_size)
        if params.n * blocks_per_seq > self.num_kv_blocks:
            raise RequestError(
                f"the request needs up to {params.n * blocks_per_seq} KV blocks but the pool has "
                f"{self.num_kv_blocks}: it could never fit"
            )
        if grammar is None:
            self.compile_grammar(params)
        return params

    def _fit_max_tokens(self, prompt: tuple[int, ...], params: SamplingParams) -> SamplingParams:
        """``params`` with ``max_tokens`` filled in (the room the prompt leaves) and checked."""
        try:
            max_tokens = fit_max_tokens(len(prompt), params.max_tokens, self.max_seq_len)
        except OutputRoomError as error:
            raise RequestError(str(error)) from error
        return attrs.evolve(params, max_tokens=max_tokens)

    def compile_grammar(self, params: SamplingParams) -> CompiledGrammar | None:
        """The request's compiled constraint (from the cache when it is there), ``None`` when
        it has none; ``RequestError`` when it cannot be built."""
        if params.structured_outputs is None:
            return None
        try:
            return self.grammar_compiler.compile(params.structured_outputs)
        except GrammarError as error:
            raise RequestError(f"structured_outputs: {error}") from error

    def abort(
        self, request_id: str, indices: SequenceOf[int] | None = None
    ) -> EngineCoreOutput | None:
        """End the request (or only its outputs at ``indices``) with finish_reason ``abort``;
        ``None`` when it is not running here."""
        group = self._groups.get(request_id)
        if group is None:
            return None
        if indices is None or all(seq.is_finished or seq.index in indices for seq in group.seqs):
            self._groups.pop(request_id)
            self.scheduler.abort(request_id)
            self._count_finished(1)
            deltas = tuple(
                SequenceDelta(index=s.index, new_token_ids=(), finish_reason="abort")
                for s in group.seqs
            )
            return EngineCoreOutput(request_id=request_id, deltas=deltas, finished=True)
        for seq in group.seqs:
            if seq.index in indices and not seq.is_finished:
                seq.status = SequenceStatus.FINISHED
        return None

    def step(self) -> list[EngineCoreOutput]:
        step = self.scheduler.schedule()
        if step.is_empty:
            return []
        if self.rollback is not None:
            self.rollback.save(step)
        result = self.runner.execute(step)
        self.scheduler.finish_step(step)
        _record_prompt_reads(result)
        outputs = self._update(result.tokens)
        if self.rollback is not None:
            self.rollback.roll_back(step, self.scheduler)
        if self.mtp_proposer is not None and result.hidden is not None:
            self.mtp_proposer.observe(step.chunks, result.hidden, self._mtp_room)
        self._count(step, sum(token.pooled is None for token in result.tokens))
        return outputs

    def _draft_pool_owner(self) -> Callable[[Sequence], None] | None:
        """Told of each sequence giving back its slot: the proposer with a draft pool."""
        proposer = self.draft_proposer or self.mtp_proposer
        return None if proposer is None else proposer.release

    def _update(self, sampled: list[SampledToken]) -> list[EngineCoreOutput]:
        """Append each sequence's sampled tokens. A sequence whose tokens cannot be appended
        (its grammar refuses or raises) fails its request alone: aborted here, an error
        output; every other request goes on."""
        deltas: dict[str, list[SequenceDelta]] = {}
        failed: dict[str, tuple[str, bool]] = {}
        by_seq: dict[int, list[SampledToken]] = {}
        pooled: dict[str, tuple[float, ...]] = {}
        for token in sampled:
            by_seq.setdefault(token.seq.seq_id, []).append(token)
            if token.pooled is not None:
                pooled[token.seq.request_id] = token.pooled
        for tokens in by_seq.values():
            seq = tokens[0].seq
            if seq.request_id in failed:
                continue
            try:
                delta = self._append_all(tokens)
            except Exception as error:
                is_request_fault = getattr(error, "is_request_fault", False)
                if is_request_fault:
                    logger.warning("request %s: %s", seq.request_id, error)
                else:
                    logger.exception(
                        "request %s: output %d cannot go on", seq.request_id, seq.index
                    )
                failed[seq.request_id] = (
                    f"output {seq.index} cannot go on: {error}",
                    is_request_fault,
                )
                continue
            deltas.setdefault(seq.request_id, []).append(delta)
        for request_id in failed:
            deltas.pop(request_id, None)
            self.abort(request_id)
        cached = {
            request_id: self._groups[request_id].primary.num_cached_tokens for request_id in deltas
        }
        prompt_logprobs = {
            request_id: entries
            for request_id in deltas
            if (entries := self._take_prompt_logprobs(self._groups[request_id])) is not None
        }
        finished = {group.request_id for group in self.scheduler.free_finished()}
        for request_id in finished:
            self._groups.pop(request_id, None)
        self._count_finished(len(finished))
        outputs = [
            EngineCoreOutput(
                request_id=request_id,
                deltas=tuple(request_deltas),
                finished=request_id in finished,
                num_cached_tokens=cached[request_id],
                prompt_logprobs=prompt_logprobs.get(request_id),
                pooled=pooled.get(request_id),
            )
            for request_id, request_deltas in deltas.items()
        ]
        outputs += [
            EngineCoreOutput(
                request_id=request_id,
                deltas=(),
                finished=True,
                error=message,
                is_request_fault=is_request_fault,
            )
            for request_id, (message, is_request_fault) in failed.items()
        ]
        return outputs

    @staticmethod
    def _take_prompt_logprobs(group: SequenceGroup) -> tuple[TokenLogprob | None, ...] | None:
        """The request's prompt logprobs (``None`` for the first token), once: when its prompt
        is done and they were not sent yet."""
        primary = group.primary
        if (
            group.params.prompt_logprobs is None
            or group.has_sent_prompt_logprobs
            or not primary.has_all_prompt_logprobs
        ):
            return None
        group.has_sent_prompt_logprobs = True
        return (None, *primary.prompt_logprobs)

    def _append_all(self, tokens: list[SampledToken]) -> SequenceDelta:
        """Append a sequence's tokens of this step (several when it had drafts) up to the first
        that ends it; one delta for all of them."""
        seq = tokens[0].seq
        num_drafts = len(seq.draft_token_ids)
        appended = [self._append(tokens[0])]
        for token in tokens[1:]:
            if appended[-1].finish_reason is not None:
                break
            appended.append(self._append(token))
        if num_drafts:
            num_kept = len(tokens) - 1  # the drafts verification kept; one more was drawn
            self.scheduler.accept_drafts(seq, min(len(appended), num_kept))
            self._count_drafts(num_drafts, num_kept)
        if len(appended) == 1:
            return appended[0]
        logprobs: list[TokenLogprob] = []
        for delta in appended:
            logprobs += delta.new_logprobs or ()
        return attrs.evolve(
            appended[-1],
            new_token_ids=tuple(t for delta in appended for t in delta.new_token_ids),
            new_logprobs=tuple(logprobs) if seq.params.logprobs is not None else None,
        )

    def _count_drafts(self, num_drafts: int, num_kept: int) -> None:
        stats = self._stats
        by_position = list(stats.num_accepted_by_position)
        by_position += [0] * (num_drafts - len(by_position))
        for position in range(num_kept):
            by_position[position] += 1
        self._stats = attrs.evolve(
            stats,
            num_draft_tokens=stats.num_draft_tokens + num_drafts,
            num_accepted_tokens=stats.num_accepted_tokens + num_kept,
            num_accepted_by_position=tuple(by_position),
        )

    def _propose(self, seqs: list[Sequence], max_tokens: int) -> list[tuple[int, ...]]:
        """Drafts for sequences about to decode (``()`` for those that take none)."""
        config = self.args.speculative_config
        assert config is not None
        limits = [min(config.num_speculative_tokens, max_tokens, self._draft_room(s)) for s in seqs]
        if self.draft_proposer is not None:
            return self.draft_proposer.propose(seqs, limits)
        if self.mtp_proposer is not None:
            return self.mtp_proposer.propose(seqs, limits)
        return [
            propose_ngram(
                seq.token_ids,
                num_tokens=limit,
                min_n=config.prompt_lookup_min,
                max_n=config.prompt_lookup_max,
            )
            for seq, limit in zip(seqs, limits, strict=True)
        ]

    def _mtp_room(self, seq: Sequence) -> int:
        config = self.args.speculative_config
        assert config is not None
        return min(config.num_speculative_tokens, self._draft_room(seq))

    def _draft_room(self, seq: Sequence) -> int:
        """How many drafts ``seq`` can take: none for requests with penalties or logit bias,
        or before min_tokens; else its room less the one token the step adds after the
        drafts."""
        params = seq.params
        assert params.max_tokens is not None
        if has_penalty(params) or params.logit_bias or seq.num_output_tokens < params.min_tokens:
            return 0
        room = min(params.max_tokens - seq.num_output_tokens, self.max_seq_len - seq.num_tokens)
        return room - 1

    def _append(self, token: SampledToken) -> SequenceDelta:
        if token.fault is not None:
            raise SamplingFaultError(token.fault)
        seq, token_id = token.seq, token.token_id
        if token.pooled is not None:
            seq.status = SequenceStatus.FINISHED
            seq.pool_state = None
            return SequenceDelta(index=seq.index, new_token_ids=(), finish_reason="stop")
        seq.append_token(token_id)
        if seq.grammar is not None and not self._advance_grammar(seq, token_id):
            stop: StopReason | None = StopReason("stop")
        else:
            stop = check_stop(
                seq, token_id, eos_token_ids=self.eos_token_ids, max_seq_len=self.max_seq_len
            )
        if stop is not None:
            seq.status = SequenceStatus.FINISHED
        return SequenceDelta(
            index=seq.index,
            new_token_ids=(token_id,),
            new_logprobs=None if token.logprob is None else (token.logprob,),
            finish_reason=None if stop is None else stop.finish_reason,
            stop_token_id=None if stop is None else stop.stop_token_id,
        )

    def _advance_grammar(self, seq: Sequence, token_id: int) -> bool:
        """Feed the sampled token to the sequence's grammar; ``False`` when the output must end
        here (the grammar is complete: it accepted EOS, even under ``ignore_eos``). Raises
        ``GrammarFaultError`` when it refuses a token its own mask allowed or the grammar engine
        stopped on a limit (its mask then allows EOS only): the request fails with an error,
        never a silent ``stop``."""
        grammar = seq.grammar
        assert grammar is not None
        is_accepted = grammar.accept_token(token_id)
        if grammar.error is not None:
            raise GrammarFaultError(
                f"structured output: the grammar is too complex for the grammar engine at "
                f"output token {seq.num_output_tokens}: {grammar.error}",
                is_request_fault=True,
            )
        if not is_accepted:
            raise GrammarFaultError(f"the grammar refused token {token_id} that its mask allowed")
        return not grammar.is_terminated

    def _count_finished(self, num_requests: int) -> None:
        """Requests leave the core here (finished, aborted or failed), whatever drives it."""
        self._stats = attrs.evolve(
            self._stats, num_finished_requests=self._stats.num_finished_requests + num_requests
        )

    def _count(self, step: SchedulerStep, num_sampled: int) -> None:
        prompt_tokens = partial = forked = 0
        for chunk in step.chunks:
            prompt_end = chunk.seq.num_prompt_tokens
            prompt_tokens += max(
                0, min(prompt_end, chunk.start + chunk.num_new_tokens) - chunk.start
            )
            partial += not chunk.samplers
            forked += len(chunk.samplers) > 1
        stats = self._stats
        self._stats = attrs.evolve(
            stats,
            num_steps=stats.num_steps + 1,
            num_prompt_tokens_computed=stats.num_prompt_tokens_computed + prompt_tokens,
            num_partial_prefill_chunks=stats.num_partial_prefill_chunks + partial,
            num_forked_sequences=stats.num_forked_sequences + forked,
            num_generated_tokens=stats.num_generated_tokens + num_sampled,
        )


def _record_prompt_reads(result: StepResult) -> None:
    """Keep what the step read of prompts on their sequences: prompt logprobs (each position
    once, so a recomputed prompt adds none) and unfinished pooling states."""
    for read in result.prompt_logprobs:
        seq = read.seq
        overlap = len(seq.prompt_logprobs) - read.first_position
        assert overlap >= 0, "prompt logprobs are computed in position order"
        seq.prompt_logprobs += read.entries[overlap:]
    for seq, state in result.pool_states:
        seq.pool_state = state
