"""Joining the default process group: gloo on the CPU, NCCL on CUDA."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from metrale_server.engine.distributed.rendezvous import Rendezvous

# A collective that waits longer than this fails: a hung worker ends the server, never hangs it.
COLLECTIVE_TIMEOUT_S = 20.0
# Loading a shard can take minutes: the start-up collectives wait this long, the steps do not.
START_TIMEOUT_S = 30 * 60.0


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def join_process_group(rendezvous: Rendezvous, device_type: str) -> None:
    if device_type == "cuda":
        torch.cuda.set_device(rendezvous.local_rank)
    dist.init_process_group(
        backend_for(device_type),
        init_method=rendezvous.init_method,
        rank=rendezvous.rank,
        world_size=rendezvous.world_size,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )


def start_up_group() -> dist.ProcessGroup:
    """Every rank calls this once, right after joining: the group of the start-up collectives
    (the engine's shape out, every rank's memory back), with the long timeout."""
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=START_TIMEOUT_S))
    assert isinstance(group, dist.ProcessGroup)
    return group


def leave_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
