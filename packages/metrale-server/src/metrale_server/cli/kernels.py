"""``met kernels``: ``check`` compiles the CUDA kernel sources without a GPU; ``cpu`` builds
the cpu backend's native ops for this machine and loads them."""

from __future__ import annotations

import click

from metrale_server.cli.common import CONTEXT


@click.group(context_settings=CONTEXT)
def kernels() -> None:
    """The CUDA kernels of the cupy backend and the native ops of the cpu backend."""


@kernels.command(context_settings=CONTEXT)
@click.option(
    "--arch",
    "archs",
    multiple=True,
    default=("sm_80", "sm_90"),
    show_default=True,
    help="A GPU architecture to compile for (repeat for several).",
)
@click.option(
    "--compiler",
    type=click.Choice(["auto", "nvrtc", "nvcc"]),
    default="auto",
    show_default=True,
    help="auto: NVRTC (what runs the kernels) where it loads, else nvcc.",
)
def check(archs: tuple[str, ...], compiler: str) -> None:
    """Compile every kernel source for each arch, one line per source and arch; no GPU needed.

    Exits 1 on any compile error or missing kernel, or when no compiler is found.
    """
    from metrale_kernels.cuda.compile_check import check_sources, find_compiler

    found = find_compiler(("nvrtc", "nvcc") if compiler == "auto" else (compiler,))
    if found is None:
        raise click.ClickException(
            "no CUDA compiler: install cupy-cuda12x and nvidia-cuda-nvrtc-cu12 (NVRTC), "
            "or put nvcc on the PATH"
        )
    results = check_sources(found, archs)
    for result in results:
        click.echo(result.line())
    failed = sum(not result.is_ok for result in results)
    click.echo(f"{len(results) - failed} of {len(results)} compiled")
    if failed:
        click.get_current_context().exit(1)


@kernels.command(context_settings=CONTEXT)
@click.option(
    "--fresh",
    is_flag=True,
    help="Build into an empty temporary cache instead of using (or filling) the shared one.",
)
def cpu(fresh: bool) -> None:
    """Build (unless cached) and load the cpu backend's native ops: one line with the
    instruction set, the library and the time. Exits 1 when they cannot be built here."""
    import tempfile
    from pathlib import Path

    from metrale_kernels.cpu.native import NativeBuildError, load_native_ops

    with tempfile.TemporaryDirectory(prefix="metrale-native-") as scratch:
        try:
            ops = load_native_ops(Path(scratch) if fresh else None)
        except NativeBuildError as error:
            raise click.ClickException(str(error)) from None
        assert ops is not None
        click.echo(
            f"native cpu ops: {ops.int8_path} (q4: {ops.q4_path}), {ops.path.name}, "
            f"{ops.describe()}"
        )
