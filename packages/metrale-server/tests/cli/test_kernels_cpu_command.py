"""``met kernels cpu``: the cpu backend's native ops built for this machine, in one line."""

from __future__ import annotations

import os
import shutil

import pytest
from click.testing import CliRunner

from metrale_server.cli.main import main


@pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None, reason="needs a C++ compiler"
)
def test_cpu_builds_the_native_ops_and_says_which_path() -> None:
    result = CliRunner().invoke(main, ["kernels", "cpu"])
    assert result.exit_code == 0, result.output
    line = result.output.strip()
    assert line.startswith("native cpu ops: ")
    assert line.split()[3].rstrip(",") in {"avx512_vnni", "avx2", "scalar"}


def test_cpu_without_a_compiler_names_the_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    import metrale_kernels.cpu.native as native

    monkeypatch.setattr(native, "_loaded", None)
    result = CliRunner().invoke(main, ["kernels", "cpu", "--fresh"])
    assert result.exit_code == 1
    assert "no C++ compiler" in result.output
