"""A tensor-parallel worker (rank 1..N-1): load this rank's shard, then run rank 0's steps."""

from __future__ import annotations

import logging
import os

import attrs
import torch
import torch.distributed as dist

from metrale_model_arch import load_model
from metrale_model_arch.parallel import TensorShard
from metrale_server.args import EngineArgs
from metrale_server.devices import resolve_device
from metrale_server.engine.distributed.channel import Heartbeat, Stop, broadcast_message
from metrale_server.engine.distributed.process_group import (
    join_process_group,
    leave_process_group,
    start_up_group,
)
from metrale_server.engine.distributed.rank_memory import RankMemory
from metrale_server.engine.distributed.rendezvous import Rendezvous
from metrale_server.engine.model_runner import ModelRunner
from metrale_server.engine.rank_setup import (
    build_runner,
    load_options,
    plan_engine,
    resolve_target,
)
from metrale_server.memory.ledger import MemoryLedger

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class WorkerSpec:
    """What rank 0 decided, so that every rank builds the same engine shape: ``engine_args``
    with the plan's KV blocks, batch size, context and weight format fixed."""

    engine_args: EngineArgs


def rank_device(args: EngineArgs, rendezvous: Rendezvous) -> torch.device:
    device = resolve_device(args.device)
    if device.type == "cuda":
        return torch.device("cuda", rendezvous.local_rank)
    return device


def run_worker(rendezvous: Rendezvous, device_type: str) -> int:
    """Serve rank 0's steps until it says stop (0) or the group breaks (1)."""
    join_process_group(rendezvous, device_type)
    try:
        start_group = start_up_group()
        box: list[object] = [None]
        dist.broadcast_object_list(box, src=0, group=start_group)
        spec = box[0]
        assert isinstance(spec, WorkerSpec)
        runner, memory = build_worker_runner(spec.engine_args, rendezvous)
        dist.gather_object(memory, None, dst=0, group=start_group)
        while True:
            message = broadcast_message(None)
            if isinstance(message, Stop):
                break
            if isinstance(message, Heartbeat):
                continue
            runner.run_step(message)
    except Exception as error:
        logger.error("tensor-parallel rank %d stops: %s", rendezvous.rank, error)
        return 1
    leave_process_group()
    return 0


def build_worker_runner(args: EngineArgs, rendezvous: Rendezvous) -> tuple[ModelRunner, RankMemory]:
    """This rank's shard and runner, planned and loaded as rank 0's (``args`` carry its plan's
    shape), and what it holds."""
    target = resolve_target(args, device=rank_device(args, rendezvous))
    plan = plan_engine(args, target)
    ledger = MemoryLedger()
    shard = TensorShard(rank=rendezvous.rank, world_size=rendezvous.world_size)
    loaded = load_model(args.model, load_options(args, plan, target, ledger, shard=shard))
    runner = build_runner(args, loaded, plan, ledger)
    memory = RankMemory(
        rank=rendezvous.rank,
        planned_by_owner=plan.allocated_by_owner(),
        ledger_by_owner=ledger.live_bytes_by_owner(),
    )
    return runner, memory


def spawned_worker_main(rendezvous: Rendezvous, device_type: str, num_threads: int) -> None:
    """The entry point of a worker this host's rank 0 started (torch.multiprocessing spawn)."""
    logging.basicConfig(level=logging.INFO, format=f"rank {rendezvous.rank}: %(message)s")
    torch.set_num_threads(num_threads)
    os._exit(run_worker(rendezvous, device_type))
