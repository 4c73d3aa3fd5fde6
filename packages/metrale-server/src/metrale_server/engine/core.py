"""``Engine``: requests in, one scheduler step at a time, ``RequestOutput``s out."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence as SequenceOf

import attrs
import torch

from metrale_model_arch import LoadedModel, load_model, read_model_config, resolve_model
from metrale_model_arch.memory import ROPE_TABLE, MemoryPlan, weight_owner
from metrale_server.engine.args import EngineArgs
from metrale_server.engine.block_manager import BlockManager
from metrale_server.engine.devices import resolve_device, resolve_dtype
from metrale_server.engine.model_runner import ModelRunner
from metrale_server.engine.scheduler import Scheduler, SchedulerConfig
from metrale_server.engine.scheduler_step import SchedulerStep
from metrale_server.engine.sequence import Sequence, SequenceStatus
from metrale_server.engine.sequence_group import SequenceGroup
from metrale_server.engine.stats import EngineStats
from metrale_server.memory.ledger import MemoryLedger
from metrale_server.memory.preflight import plan_engine_memory
from metrale_server.output.outputs import RequestOutput, TokenLogprob
from metrale_server.output.text_state import TextState
from metrale_server.sampling.params import SamplingParams
from metrale_server.sampling.sampler import sample
from metrale_server.sampling.tensors import (
    SamplingRow,
    make_seeded_generator,
    prepare_sampling_batch,
)


class RequestError(ValueError):
    """A request the engine refuses before it runs (it could never fit, or is malformed)."""


@attrs.define(eq=False)
class _Request:
    prompt: str | None
    group: SequenceGroup
    texts: list[TextState]
    generators: list[torch.Generator | None]


class Engine:
    """Continuous batching over one paged KV pool.

    Contract: ``add_request`` validates and queues (or raises ``RequestError``, changing
    nothing); ``step`` runs one scheduler step and returns an output for every request that
    produced tokens or finished in it; ``abort`` frees everything a request holds. Not
    thread-safe: one thread drives it (``AsyncEngine`` does).
    """

    def __init__(
        self,
        args: EngineArgs,
        loaded: LoadedModel | None = None,
        *,
        plan: MemoryPlan | None = None,
        ledger: MemoryLedger | None = None,
    ) -> None:
        """Plan memory from the config (raising ``MemoryPlanError`` before anything loads when
        it does not fit), load the model through the ledger, then allocate the KV pool and step
        arena the plan sized. A ``loaded`` model is charged to a new ledger unless ``ledger``
        (through which it was loaded) is given."""
        if loaded is not None and ledger is None:
            ledger = MemoryLedger()
            _adopt_model(ledger, loaded)
        self.ledger = ledger if ledger is not None else MemoryLedger()
        if loaded is None:
            device = resolve_device(args.device)
            dtype = resolve_dtype(args.dtype, device)
            if plan is None:
                config = read_model_config(resolve_model(args.model))
                plan = plan_engine_memory(args, config, device=device, dtype=dtype)
            loaded = load_model(
                args.model,
                dtype=dtype,
                device=device,
                max_seq_len=plan.inputs.max_seq_len,
                allocator=self.ledger.allocate,
            )
        elif plan is None:
            max_seq_len = min(args.max_seq_len or loaded.max_seq_len, loaded.max_seq_len)
            plan = plan_engine_memory(
                attrs.evolve(args, max_seq_len=max_seq_len),
                loaded.config,
                device=loaded.device,
                dtype=loaded.dtype,
            )
        self.loaded = loaded
        self.args = args
        self.plan = plan
        self.max_seq_len = plan.inputs.max_seq_len
        self.max_batch_size = plan.max_batch_size
        self.num_kv_blocks = plan.kv_blocks
        self.block_manager = BlockManager(
            self.num_kv_blocks, args.block_size, enable_prefix_caching=args.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_batch_size=self.max_batch_size, max_batch_tokens=args.max_batch_tokens
            ),
            self.block_manager,
        )
        self.runner = ModelRunner(
            loaded,
            num_blocks=self.num_kv_blocks,
            block_size=args.block_size,
            max_batch_tokens=args.max_batch_tokens,
            max_batch_size=self.max_batch_size,
            allocator=self.ledger.allocate,
        )
        self._generator = torch.Generator(device=loaded.device)
        self._generator.manual_seed(args.seed)
        self._requests: dict[str, _Request] = {}
        self._seq_ids = itertools.count()
        self._stats = EngineStats()
        self.eos_token_ids = loaded.eos_token_ids

    @property
    def stats(self) -> EngineStats:
        return attrs.evolve(self._stats, num_preemptions=self.scheduler.num_preemptions)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._requests)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: SequenceOf[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request; ``prompt`` is its text, if it came as text (reported back only)."""
        if request_id in self._requests:
            raise RequestError(f"request id {request_id!r} is already running")
        prompt_ids = tuple(int(t) for t in prompt_token_ids)
        params = self.check_request(prompt_ids, params)
        arrival = time.monotonic() if arrival_time is None else arrival_time
        seqs = [
            Sequence(
                seq_id=next(self._seq_ids),
                request_id=request_id,
                prompt_token_ids=prompt_ids,
                params=params,
                arrival_time=arrival,
            )
            for _ in range(params.n)
        ]
        generators: list[torch.Generator | None] = [
            None
            if params.seed is None
            else make_seeded_generator(params.seed + i, self.loaded.device)
            for i in range(params.n)
        ]
        group = SequenceGroup(request_id=request_id, seqs=seqs, params=params, arrival_time=arrival)
        texts = [TextState(self.loaded.tokenizer, params) for _ in range(params.n)]
        self._requests[request_id] = _Request(
            prompt=prompt, group=group, texts=texts, generators=generators
        )
        self.scheduler.add(group)

    def check_request(self, prompt: tuple[int, ...], params: SamplingParams) -> SamplingParams:
        """Refuse what can never run; fill ``max_tokens`` when the caller left it open."""
        if not prompt:
            raise RequestError("the prompt is empty")
        vocab_size = self.loaded.config.vocab_size
        if any(not 0 <= t < vocab_size for t in prompt):
            raise RequestError(f"prompt token ids must be in 0..{vocab_size - 1}")
        room = self.max_seq_len - len(prompt)
        if room < 1:
            raise RequestError(
                f"the prompt has {len(prompt)} tokens; max_seq_len is {self.max_seq_len}, "
                "which leaves no room for output"
            )
        if params.max_tokens is None:
            params = attrs.evolve(params, max_tokens=room)
        assert params.max_tokens is not None
        if len(prompt) + params.max_tokens > self.max_seq_len:
            raise RequestError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                f"max_seq_len ({self.max_seq_len})"
            )
        if params.n > self.max_batch_size:
            raise RequestError(f"n ({params.n}) exceeds max_batch_size ({self.max_batch_size})")
        blocks_per_seq = -(-(len(prompt) + params.max_tokens) // self.args.block_size)
        if params.n * blocks_per_seq > self.num_kv_blocks:
            raise RequestError(
                f"the request needs up to {params.n * blocks_per_seq} KV blocks but the pool has "
                f"{self.num_kv_blocks}: it could never fit"
            )
        return params

    def abort(self, request_id: str) -> RequestOutput | None:
        request = self._requests.pop(request_id, None)
        if request is None:
            return None
        self.scheduler.abort(request_id)
        for text in request.texts:
            text.finish("abort")
        return self._report(request)

    def step(self) -> list[RequestOutput]:
        step = self.scheduler.schedule()
        if step.is_empty:
            return []
        logits = self.runner.execute(step)
        self.scheduler.finish_step(step)
        self._count(step)

        rows: list[SamplingRow] = []
        row_seqs: list[Sequence] = []
        row_logits: list[int] = []
        for index, chunk in enumerate(c for c in step.chunks if c.samplers):
            for seq in chunk.samplers:
                request = self._requests[seq.request_id]
                position = request.group.seqs.index(seq)
                rows.append(
                    SamplingRow(
                        params=seq.params,
                        prompt_token_ids=seq.prompt_token_ids,
                        output_token_ids=seq.output_token_ids,
                        generator=request.generators[position],
                        eos_token_ids=self.eos_token_ids,
                    )
                )
                row_seqs.append(seq)
                row_logits.append(index)
        touched: dict[str, _Request] = {}
        if rows:
            if len(row_logits) != logits.shape[0]:
                logits = logits[torch.tensor(row_logits, device=logits.device)]
            batch = prepare_sampling_batch(rows, logits.shape[1], logits.device)
            sampled = sample(logits, batch, generator=self._generator)
            for seq, token_id, logprobs in zip(
                row_seqs, sampled.token_ids, sampled.logprobs, strict=True
            ):
                request = self._requests[seq.request_id]
                text = request.texts[request.group.seqs.index(seq)]
                if logprobs is not None:
                    text.add_logprob(
                        TokenLogprob(
                            token_id=token_id,
                            logprob=logprobs.logprob,
                            top=tuple(
                                zip(logprobs.top_token_ids, logprobs.top_logprobs, strict=True)
                            ),
                        )
                    )
                self._append_token(seq, token_id, text)
                touched[seq.request_id] = request
        finished = self.scheduler.free_finished()
        for group in finished:
            self._requests.pop(group.request_id, None)
        self._stats = attrs.evolve(
            self._stats,
            num_generated_tokens=self._stats.num_generated_tokens + len(row_seqs),
            num_finished_requests=self._stats.num_finished_requests + len(finished),
        )
        return [self._report(request) for request in touched.values()]

    def _count(self, step: SchedulerStep) -> None:
        prompt_tokens = partial = forked = 0
        for chunk in step.chunks:
            prompt_end = chunk.seq.num_prompt_tokens
            prompt_tokens += max(
                0, min(prompt_end, chunk.start + chunk.num_new_tokens) - chunk.start
            )
            partial += not chunk.samplers
            forked += len(chunk.samplers) > 1
        self._stats = attrs.evolve(
            self._stats,
            num_steps=self._stats.num_steps + 1,
            num_prompt_tokens_computed=self._stats.num_prompt_tokens_computed + prompt_tokens,
            num_partial_prefill_chunks=self._stats.num_partial_prefill_chunks + partial,
            num_forked_sequences=self._stats.num_forked_sequences + forked,
        )

    def _append_token(self, seq: Sequence, token_id: int, text: TextState) -> None:
        params = seq.params
        seq.append_token(token_id)
        is_stop_token = token_id in params.stop_token_ids
        is_eos = not params.ignore_eos and token_id in self.eos_token_ids
        past_min_tokens = seq.num_output_tokens >= params.min_tokens
        text.add_token(
            token_id,
            render=not (is_stop_token or is_eos),
            check_stop_strings=past_min_tokens,
        )
        if text.finish_reason is None:
            if is_stop_token:
                text.finish("stop", token_id)
            elif is_eos:
                text.finish("stop")
            elif (
                params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens
            ) or seq.num_tokens >= self.max_seq_len:
                text.finish("length")
        if text.finish_reason is not None:
            seq.status = SequenceStatus.FINISHED

    def _report(self, request: _Request) -> RequestOutput:
        outputs = tuple(text.report(i) for i, text in enumerate(request.texts))
        return RequestOutput(
            request_id=request.group.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.group.primary.prompt_token_ids,
            outputs=outputs,
            finished=all(o.finished for o in outputs),
            num_cached_tokens=request.group.primary.num_cached_tokens,
        )


def _adopt_model(ledger: MemoryLedger, loaded: LoadedModel) -> None:
    for name, param in loaded.model.named_parameters():
        ledger.adopt(weight_owner(name), param)
    for _, buffer in loaded.model.named_buffers():
        ledger.adopt(ROPE_TABLE, buffer)
