"""``build_engine``: the one way an engine comes to be, from its args to a ready ``Engine``.

Order: resolve what is served (config, device, dtype) from files alone; plan memory (raising
``MemoryPlanError`` before anything loads when it does not fit); start the other ranks of a
tensor-parallel group and tell them the plan; load this rank's model through the allocation
ledger; allocate the KV pool and step arena; load the draft model (or allocate the MTP
proposer's draft pool); start the layer compiler.
``EngineCore`` receives the finished parts and builds nothing. ``met serve``, ``met
generate``/``chat`` and ``LLM`` all go through here; the other ranks and ``met memory`` take
the same steps (:mod:`~metrale_server.engine.rank_setup`) for their part.
"""

from __future__ import annotations

import attrs

from metrale_model_arch import ChatTemplate, LoadedModel, LoadOptions, load_model
from metrale_model_arch.loading import ProgressObserver
from metrale_model_arch.memory import ROPE_TABLE, MemoryPlan, draft_max_seq_len, weight_owner
from metrale_model_arch.owners import ROPE_TABLE_BUFFER
from metrale_model_arch.parallel import TensorShard, check_runs_split
from metrale_server.args import EngineArgs
from metrale_server.engine.core import EngineCore, EngineParts
from metrale_server.engine.distributed.rank_memory import RankMemory
from metrale_server.engine.distributed.tensor_parallel import TensorParallelGroup
from metrale_server.engine.engine import Engine
from metrale_server.engine.layer_compiler import LayerCompiler, install_native_executor
from metrale_server.engine.rank_setup import (
    build_runner,
    load_options,
    plan_engine,
    resolve_target,
    worker_engine_args,
)
from metrale_server.engine.state_rollback import build_state_rollback
from metrale_server.memory.ledger import MemoryLedger
from metrale_server.memory.preflight import plan_engine_memory
from metrale_server.pooling.model_task import resolve_model_task
from metrale_server.speculative import DraftModelProposer, MtpProposer, check_same_tokenizer
from metrale_server.speculative.draft_model import draft_allocator


def build_engine(
    args: EngineArgs,
    loaded: LoadedModel | None = None,
    *,
    plan: MemoryPlan | None = None,
    ledger: MemoryLedger | None = None,
    chat_template: ChatTemplate | None = None,
    on_progress: ProgressObserver | None = None,
) -> Engine:
    """A ready engine for ``args``.

    ``plan``: already made (``met serve`` logs it before loading); by default made here.
    ``loaded``: a model loaded by the caller (several engines over one model, in tests): it is
    charged to a new ledger unless ``ledger`` (through which it was loaded) is given, and the
    plan is made for it. ``chat_template`` replaces the model's own; ``on_progress(done,
    total)`` hears of every checkpoint tensor loaded.
    """
    if loaded is not None and args.tensor_parallel_size > 1:
        raise ValueError(
            "tensor_parallel_size > 1: the engine loads each rank's shard itself; "
            "pass no loaded model"
        )
    if loaded is None:
        ledger = MemoryLedger() if ledger is None else ledger
        target = resolve_target(args)
        plan = plan_engine(args, target) if plan is None else plan
    else:
        if ledger is None:
            ledger = MemoryLedger()
            adopt_model(ledger, loaded)
        if plan is None:
            max_seq_len = min(args.max_seq_len or loaded.max_seq_len, loaded.max_seq_len)
            plan = plan_engine_memory(
                attrs.evolve(args, max_seq_len=max_seq_len),
                loaded.config,
                device=loaded.device,
                dtype=loaded.dtype,
                quantization=loaded.quantization,
            )
    parallel = None
    try:
        if loaded is None:
            shard = None
            if args.tensor_parallel_size > 1:
                check_runs_split(target.config, args.tensor_parallel_size)
                parallel = TensorParallelGroup.start(args.tensor_parallel_size, target.device.type)
                parallel.share(worker_engine_args(args, plan))
                shard = TensorShard(rank=0, world_size=args.tensor_parallel_size)
            options = load_options(args, plan, target, ledger, shard=shard, on_progress=on_progress)
            loaded = load_model(args.model, options)
        if chat_template is not None:
            template = attrs.evolve(
                chat_template, special_tokens=loaded.tokenizer.special_tokens_map
            )
            loaded = attrs.evolve(loaded, chat_template=template)
        args = attrs.evolve(args, block_size=plan.inputs.block_size)
        parts = _build_parts(args, loaded, plan, ledger, parallel)
    except BaseException:
        if parallel is not None:
            parallel.close()
        raise
    return Engine(EngineCore(parts))


def _build_parts(
    args: EngineArgs,
    loaded: LoadedModel,
    plan: MemoryPlan,
    ledger: MemoryLedger,
    parallel: TensorParallelGroup | None,
) -> EngineParts:
    task = resolve_model_task(args.task, loaded)
    runner = build_runner(args, loaded, plan, ledger)
    rank_memory: tuple[RankMemory, ...] = ()
    if parallel is not None:
        own = RankMemory(
            rank=0,
            planned_by_owner=plan.allocated_by_owner(),
            ledger_by_owner=ledger.live_bytes_by_owner(),
        )
        rank_memory = parallel.collect_memory(own)
        runner.workers = parallel.channel
    rollback = build_state_rollback(args, loaded, plan, ledger, runner)
    draft_proposer = _load_draft_proposer(args, loaded, plan, ledger)
    mtp_proposer = _mtp_proposer(args, loaded, plan, ledger)
    # NOTE: the compiled layer steps would trace the collectives of a split model: eager.
    compiler = LayerCompiler.start_if_useful(
        loaded.model, enforce_eager=args.enforce_eager or parallel is not None
    )
    return EngineParts(
        args=args,
        plan=plan,
        loaded=loaded,
        ledger=ledger,
        task=task,
        runner=runner,
        parallel=parallel,
        rank_memory=rank_memory,
        draft_proposer=draft_proposer,
        mtp_proposer=mtp_proposer,
        rollback=rollback,
        compiler=compiler,
    )


def _mtp_proposer(
    args: EngineArgs, loaded: LoadedModel, plan: MemoryPlan, ledger: MemoryLedger
) -> MtpProposer | None:
    """The proposer of ``--speculative-config`` method mtp over the model's own MTP layer,
    its draft pool allocated through the ledger; ``None`` for any other method."""
    speculative = args.speculative_config
    if speculative is None or not speculative.is_mtp:
        return None
    return MtpProposer(
        loaded,
        num_speculative_tokens=speculative.num_speculative_tokens,
        num_slots=plan.max_batch_size,
        num_blocks=plan.kv_blocks,
        block_size=plan.inputs.block_size,
        max_seq_len=plan.inputs.max_seq_len,
        allocator=ledger.allocate,
    )


def _load_draft_proposer(
    args: EngineArgs, loaded: LoadedModel, plan: MemoryPlan, ledger: MemoryLedger
) -> DraftModelProposer | None:
    """The draft model of ``--speculative-config`` (method draft_model), loaded through the
    ledger under its own owners, with its KV pool; ``None`` for any other method."""
    speculative, draft_inputs = args.speculative_config, plan.inputs.draft
    if speculative is None or speculative.model is None:
        return None
    assert draft_inputs is not None  # the plan reserved for it
    max_seq_len = plan.inputs.max_seq_len
    options = LoadOptions(
        dtype=loaded.dtype,
        device=loaded.device,
        max_seq_len=draft_max_seq_len(draft_inputs.config, max_seq_len),
        allocator=draft_allocator(ledger.allocate),
        quantization=draft_inputs.quantization,
        kernel_backend=args.kernel_backend,
    )
    draft = load_model(speculative.model, options)
    check_same_tokenizer(loaded, draft)
    install_native_executor(draft.model)
    return DraftModelProposer(
        draft,
        num_slots=plan.max_batch_size,
        num_blocks=plan.kv_blocks,
        max_seq_len=max_seq_len,
        block_size=plan.inputs.block_size,
        vocab_size=loaded.config.vocab_size,
        allocator=ledger.allocate,
    )


def adopt_model(ledger: MemoryLedger, loaded: LoadedModel) -> None:
    """Charge a model loaded outside any ledger to ``ledger``, each tensor to its owner."""
    for name, param in loaded.model.named_parameters():
        ledger.adopt(weight_owner(name), param)
    for name, buffer in loaded.model.named_buffers():
        # Int8 weights are buffers too (``qweight``, ``scale``); the RoPE table is the other.
        owner = ROPE_TABLE if name.endswith(ROPE_TABLE_BUFFER) else weight_owner(name)
        ledger.adopt(owner, buffer)
