"""Rank 0's handle on a tensor-parallel group: start (or join) it, share the engine's shape,
collect every rank's memory, send the steps, close it."""

from __future__ import annotations

import os
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing

from metrale_server.args import EngineArgs
from metrale_server.engine.distributed.channel import WorkerChannel
from metrale_server.engine.distributed.process_group import (
    COLLECTIVE_TIMEOUT_S,
    join_process_group,
    leave_process_group,
    start_up_group,
)
from metrale_server.engine.distributed.rank_memory import RankMemory
from metrale_server.engine.distributed.rendezvous import Rendezvous
from metrale_server.engine.distributed.worker import WorkerSpec, spawned_worker_main

JOIN_TIMEOUT_S = 10.0
LOST_WORKER_WAIT_S = 2.0


class TensorParallelGroup:
    """Contract: ``start`` returns once every rank joined (workers started here, on this host,
    by torch.multiprocessing spawn; or, under ``torchrun``, the ranks it started); ``share``
    sends the engine's fixed shape, ``collect_memory`` every rank's plan and ledger (after
    each loaded its shard); ``channel`` then carries the steps; ``close`` ends the workers
    this host started and leaves the group."""

    def __init__(self, rendezvous: Rendezvous, processes: list[BaseProcess]) -> None:
        self.rendezvous = rendezvous
        self.processes = processes
        self.memory: tuple[RankMemory, ...] = ()
        self._start_group = start_up_group()
        self._channel: WorkerChannel | None = None

    @property
    def world_size(self) -> int:
        return self.rendezvous.world_size

    @classmethod
    def start(cls, world_size: int, device_type: str) -> TensorParallelGroup:
        launched = Rendezvous.from_environ()
        processes: list[BaseProcess] = []
        if launched is not None:
            if launched.world_size != world_size:
                raise ValueError(
                    f"--tensor-parallel-size {world_size} but the launcher started "
                    f"WORLD_SIZE={launched.world_size} ranks"
                )
            if launched.rank != 0:
                raise ValueError(f"rank {launched.rank} is a worker; only rank 0 runs the engine")
            rendezvous = launched
        else:
            rendezvous = Rendezvous.on_this_host(world_size)
            context = torch.multiprocessing.get_context("spawn")
            threads = max(1, (os.cpu_count() or 1) // world_size)
            for rank in range(1, world_size):
                process = context.Process(
                    target=spawned_worker_main,
                    args=(rendezvous.for_rank(rank), device_type, threads),
                    name=f"metrale-tp-rank-{rank}",
                    daemon=True,
                )
                process.start()
                processes.append(process)
        try:
            join_process_group(rendezvous, device_type)
            return cls(rendezvous, processes)
        except Exception:
            _end(processes)
            raise

    def share(self, args: EngineArgs) -> None:
        dist.broadcast_object_list([WorkerSpec(engine_args=args)], src=0, group=self._start_group)

    def collect_memory(self, own: RankMemory) -> tuple[RankMemory, ...]:
        gathered: list[object] = [None] * self.world_size
        dist.gather_object(own, gathered, dst=0, group=self._start_group)
        self.memory = tuple(m for m in gathered if isinstance(m, RankMemory))
        return self.memory

    @property
    def channel(self) -> WorkerChannel:
        """Created on first use: its heartbeat starts with it, after the start-up collectives."""
        if self._channel is None:
            self._channel = WorkerChannel(self.describe_lost)
        return self._channel

    def describe_lost(self) -> str | None:
        """``rank 1 (pid 123) exited with code -9`` (or ``is stopped``) for a worker this host
        started; ``None`` when every one still runs (the error then speaks for itself) or the
        launcher started them."""
        deadline = time.monotonic() + LOST_WORKER_WAIT_S
        while self.processes:
            dead = [
                f"rank {rank} (pid {process.pid}) exited with code {process.exitcode}"
                for rank, process in enumerate(self.processes, start=1)
                if not process.is_alive()
            ]
            if dead:
                return "; ".join(dead)
            if time.monotonic() > deadline:
                stuck = [
                    f"rank {rank} (pid {process.pid}) is {state} and did not answer within "
                    f"the collective timeout ({COLLECTIVE_TIMEOUT_S:g} s)"
                    for rank, process in enumerate(self.processes, start=1)
                    if (state := _process_state(process.pid)) is not None
                ]
                return "; ".join(stuck) or None
            time.sleep(0.05)
        return None

    def close(self) -> None:
        stopped = self._channel is not None and self._channel.failure is None
        if self._channel is not None:
            self._channel.close()
        _end(self.processes, JOIN_TIMEOUT_S if stopped else 0.0)
        leave_process_group()


def _process_state(pid: int | None) -> str | None:
    """``stopped`` or ``in uninterruptible sleep`` from /proc (Linux), else ``None``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state = stat.rpartition(")")[2].split()[0]
    return {"T": "stopped", "t": "stopped (traced)", "D": "in uninterruptible sleep"}.get(state)


def _end(processes: list[BaseProcess], wait_s: float = 0.0) -> None:
    for process in processes:
        process.join(wait_s)
        if process.is_alive():
            process.kill()
            process.join(JOIN_TIMEOUT_S)
