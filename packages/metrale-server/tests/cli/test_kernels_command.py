"""``met kernels check``: every CUDA kernel source compiled without a GPU, one line each."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from metrale_kernels.cuda import compile_check
from metrale_kernels.cuda.sources import KERNEL_SOURCES, KernelSource, source_code
from metrale_server.cli.main import main

pytestmark = pytest.mark.skipif(
    compile_check.find_compiler() is None,
    reason="neither NVRTC (cupy + nvidia-cuda-nvrtc) nor nvcc is available",
)


def test_check_prints_one_ok_line_per_source_and_arch() -> None:
    result = CliRunner().invoke(main, ["kernels", "check", "--arch", "sm_90"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == len(KERNEL_SOURCES) + 1
    for source, line in zip(KERNEL_SOURCES, lines, strict=False):
        assert line.split()[:2] == [source.name, "sm_90"]
        assert line.endswith("OK")
    assert lines[-1] == f"{len(KERNEL_SOURCES)} of {len(KERNEL_SOURCES)} compiled"


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
    assert f"{len(KERNEL_SOURCES) - 1} of {len(KERNEL_SOURCES)} compiled" in result.output
