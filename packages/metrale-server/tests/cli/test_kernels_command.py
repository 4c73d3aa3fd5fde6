"""``met kernels check``: every CUDA kernel source compiled without a GPU, one line each.

The command's output and exit status are checked over two sources; that every source compiles
is metrale-kernels' test (``test_cuda_compile_check.py``) and the nox ``kernels`` session's."""

from __future__ import annotations

import functools

import pytest
from click.testing import CliRunner

from metrale_kernels.cuda import compile_check
from metrale_kernels.cuda.sources import KERNEL_SOURCES, KernelSource, source_code
from metrale_server.cli.main import main

pytestmark = pytest.mark.skipif(
    compile_check.find_compiler() is None,
    reason="neither NVRTC (cupy + nvidia-cuda-nvrtc) nor nvcc is available",
)


TWO_SOURCES = tuple(source for source in KERNEL_SOURCES if source.name in {"norms", "rotary"})


@pytest.fixture(autouse=True)
def two_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    checked = functools.partial(compile_check.check_sources, sources=TWO_SOURCES)
    monkeypatch.setattr(compile_check, "check_sources", checked)


def test_check_prints_one_ok_line_per_source_and_arch() -> None:
    result = CliRunner().invoke(main, ["kernels", "check", "--arch", "sm_90"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == len(TWO_SOURCES) + 1
    for source, line in zip(TWO_SOURCES, lines, strict=False):
        assert line.split()[:2] == [source.name, "sm_90"]
        assert line.endswith("OK")
    assert lines[-1] == "2 of 2 compiled"


def test_check_fails_on_a_source_that_does_not_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_norms(source: KernelSource) -> str:
        code = source_code(source)
        return (
            code + "\n__device__ int broken = not_declared;\n" if source.name == "norms" else code
        )

    monkeypatch.setattr(compile_check, "source_code", broken_norms)
    result = CliRunner().invoke(main, ["kernels", "check", "--arch", "sm_80"])
    assert result.exit_code == 1
    norms_line = next(line for line in result.output.splitlines() if line.startswith("norms"))
    assert "error" in norms_line
    assert "not_declared" in norms_line
    assert "1 of 2 compiled" in result.output
