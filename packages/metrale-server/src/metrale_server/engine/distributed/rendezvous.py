"""Where the ranks of a tensor-parallel group meet (``env://``), and which rank this one is."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import attrs

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@attrs.frozen(kw_only=True)
class Rendezvous:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    # Started by a launcher (torchrun), whose store the ranks join through ``env://``.
    is_launched: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Rendezvous | None:
        """The launcher's (``torchrun``) rendezvous; ``None`` when no launcher started us."""
        environ = os.environ if environ is None else environ
        if "RANK" not in environ or "WORLD_SIZE" not in environ:
            return None
        missing = [name for name in TORCHRUN_VARIABLES[2:] if name not in environ]
        if missing:
            raise ValueError(
                f"RANK and WORLD_SIZE are set but {', '.join(missing)} are not: start every "
                "rank with torchrun (or set all of " + ", ".join(TORCHRUN_VARIABLES) + ")"
            )
        return cls(
            rank=int(environ["RANK"]),
            world_size=int(environ["WORLD_SIZE"]),
            local_rank=int(environ["LOCAL_RANK"]),
            master_addr=environ["MASTER_ADDR"],
            master_port=int(environ["MASTER_PORT"]),
            is_launched=True,
        )

    @classmethod
    def on_this_host(cls, world_size: int) -> Rendezvous:
        """Rank 0 of ``world_size`` ranks on 127.0.0.1, at a free port."""
        return cls(
            rank=0,
            world_size=world_size,
            local_rank=0,
            master_addr="127.0.0.1",
            master_port=free_port(),
        )

    def for_rank(self, rank: int) -> Rendezvous:
        return attrs.evolve(self, rank=rank, local_rank=rank)

    @property
    def init_method(self) -> str:
        if self.is_launched:
            return "env://"
        return f"tcp://{self.master_addr}:{self.master_port}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
