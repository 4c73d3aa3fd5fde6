"""``Rendezvous``: the launcher's environment, or rank 0 on this host."""

from __future__ import annotations

import pytest

from metrale_server.engine.distributed import Rendezvous

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "MASTER_ADDR": "10.0.0.2",
    "MASTER_PORT": "29500",
}


def test_torchrun_ranks_join_its_store() -> None:
    rendezvous = Rendezvous.from_environ(TORCHRUN)
    assert rendezvous == Rendezvous(
        rank=3,
        world_size=8,
        local_rank=1,
        master_addr="10.0.0.2",
        master_port=29500,
        is_launched=True,
    )
    assert rendezvous.init_method == "env://"


def test_without_a_launcher_there_is_none() -> None:
    assert Rendezvous.from_environ({"PATH": "/bin"}) is None


def test_a_partial_launcher_environment_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match="MASTER_ADDR, MASTER_PORT are not"):
        Rendezvous.from_environ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})


def test_this_host_meets_on_loopback_at_a_free_port() -> None:
    rendezvous = Rendezvous.on_this_host(2)
    assert (rendezvous.rank, rendezvous.world_size) == (0, 2)
    assert rendezvous.init_method == f"tcp://127.0.0.1:{rendezvous.master_port}"
    assert rendezvous.for_rank(1).rank == 1
    assert rendezvous.for_rank(1).master_port == rendezvous.master_port
