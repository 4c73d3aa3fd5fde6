"""``met``: the command line. One module per command; ``metrale-serve`` is ``met serve``."""

from __future__ import annotations

import click

from metrale_bench.cli import bench
from metrale_server.cli.chat import chat
from metrale_server.cli.common import CONTEXT, check_environment_or_exit
from metrale_server.cli.generate import generate
from metrale_server.cli.kernels import kernels
from metrale_server.cli.memory import memory
from metrale_server.cli.quantize import quantize
from metrale_server.cli.serve import serve, serve_main
from metrale_server.cli.top import top

__all__ = ["main", "serve_main"]


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="metrale-server", prog_name="met")
def main() -> None:
    """Metrale: an LLM inference server."""
    check_environment_or_exit()


for command in (generate, serve, top, chat, memory, quantize, kernels, bench):
    main.add_command(command)
