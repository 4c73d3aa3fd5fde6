"""What every rank does to build its part of an engine: resolve the target from files alone,
plan its memory, load it as planned, and build the runner over the KV pool the plan sized.
Rank 0 does it in :func:`~metrale_server.engine.bootstrap.build_engine`, the other ranks of a
tensor-parallel group in :mod:`~metrale_server.engine.distributed.worker`.
"""

from __future__ import annotations

import attrs
import torch

from metrale_config import ModelConfig
from metrale_model_arch import LoadedModel, LoadOptions, image_encoder_for, serves_images
from metrale_model_arch.loading import ProgressObserver
from metrale_model_arch.memory import MemoryPlan
from metrale_model_arch.parallel import TensorShard
from metrale_server.args import EngineArgs
from metrale_server.devices import check_dtype_runs, resolve_device, resolve_dtype
from metrale_server.engine.encoder_cache import EncoderCache
from metrale_server.engine.image_step import ImageStep
from metrale_server.engine.model_runner import ModelRunner
from metrale_server.memory.ledger import MemoryLedger
from metrale_server.memory.preflight import plan_engine_memory
from metrale_server.pooling.model_task import engine_model_config, serves_embeddings


@attrs.frozen(kw_only=True)
class EngineTarget:
    """What an engine serves, resolved before anything loads: the model's config (without its
    head for an embedding task), the device and the activations' dtype."""

    config: ModelConfig
    device: torch.device
    dtype: torch.dtype


def resolve_target(
    args: EngineArgs, *, device: torch.device | None = None, config: ModelConfig | None = None
) -> EngineTarget:
    """``args``' target; ``device`` and ``config`` replace what ``args`` would resolve to (a
    tensor-parallel rank's own GPU; a bare config.json ``met memory`` was given)."""
    device = resolve_device(args.device) if device is None else device
    config = engine_model_config(args) if config is None else config
    dtype = resolve_dtype(args.dtype, device, config)
    check_dtype_runs(dtype, device, args.kernel_backend)
    return EngineTarget(config=config, device=device, dtype=dtype)


def plan_engine(
    args: EngineArgs, target: EngineTarget, *, total_bytes: int | None = None
) -> MemoryPlan:
    """The memory plan of serving ``target`` with ``args`` (one rank's, under tensor
    parallelism) on a device of ``total_bytes`` (default: this one's)."""
    return plan_engine_memory(
        args, target.config, device=target.device, dtype=target.dtype, total_bytes=total_bytes
    )


def load_options(
    args: EngineArgs,
    plan: MemoryPlan,
    target: EngineTarget,
    ledger: MemoryLedger,
    *,
    shard: TensorShard | None = None,
    on_progress: ProgressObserver | None = None,
) -> LoadOptions:
    """How the plan says to load the target model, through ``ledger``."""
    return LoadOptions(
        dtype=target.dtype,
        device=target.device,
        max_seq_len=plan.inputs.max_seq_len,
        quantization=plan.inputs.quantization,
        kernel_backend=args.kernel_backend,
        shard=shard,
        without_head=serves_embeddings(args.task, args.model),
        # As planned: a tower only to take images, MTP layers only to speculate with them.
        text_only=not serves_images(target.config),
        without_mtp=target.config.mtp is None,
        allocator=ledger.allocate,
        on_progress=on_progress,
    )


def build_runner(
    args: EngineArgs, loaded: LoadedModel, plan: MemoryPlan, ledger: MemoryLedger
) -> ModelRunner:
    """The runner over ``loaded`` with the KV pool, per-sequence state and step arena the plan
    sized, allocated through ``ledger`` (every rank builds the same)."""
    runner = ModelRunner(
        loaded,
        num_blocks=plan.kv_blocks,
        block_size=plan.inputs.block_size,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_size=plan.max_batch_size,
        max_seq_len=plan.inputs.max_seq_len,
        allocator=ledger.allocate,
        seed=args.seed,
        indexer_paged=plan.inputs.indexer_paged,
        kv_cache_dtype=plan.inputs.kv_cache_dtype,
        keep_hidden=args.speculative_config is not None and args.speculative_config.is_mtp,
        ring=plan.ring,
    )
    runner.image_step = image_step(loaded, plan, ledger)
    return runner


def image_step(loaded: LoadedModel, plan: MemoryPlan, ledger: MemoryLedger) -> ImageStep | None:
    """The encoder step of a model loaded with a vision tower the engine serves, its output
    cache allocated through ``ledger`` as the plan sized it; ``None`` for a text-only model."""
    encoder, planned = image_encoder_for(loaded), plan.inputs.encoder
    if encoder is None or planned is None:
        return None
    cache = EncoderCache(
        cache_tokens=planned.cache_tokens,
        hidden_size=encoder.hidden_size,
        dtype=loaded.dtype,
        device=loaded.device,
        allocator=ledger.allocate,
    )
    return ImageStep(encoder, cache, batch_tokens=planned.batch_tokens)


def worker_engine_args(args: EngineArgs, plan: MemoryPlan) -> EngineArgs:
    """``args`` with what rank 0's plan decided fixed, so every rank plans the same shape."""
    return attrs.evolve(
        args,
        num_kv_blocks=plan.kv_blocks,
        max_batch_size=plan.max_batch_size,
        max_seq_len=plan.inputs.max_seq_len,
        quantization=plan.inputs.quantization.value,
        block_size=plan.inputs.block_size,
    )
