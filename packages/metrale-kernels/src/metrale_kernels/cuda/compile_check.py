"""Compile every kernel source for the target GPU architectures without a GPU.

NVRTC (through CuPy's bindings, with ``nvidia-cuda-nvrtc`` providing the library) compiles
with exactly the options used at run time; where it cannot be loaded, ``nvcc`` does. Either
way the PTX must define every kernel the backend launches.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from metrale_kernels.cuda.sources import KERNEL_SOURCES, NVRTC_OPTIONS, KernelSource, source_code

ARCHS = ("sm_80", "sm_90")
_ENTRY = re.compile(r"\.entry\s+(\w+)")

# (code, file name, arch) -> PTX; raises CompileError with the compiler's log.
Compile = Callable[[str, str, str], str]


class CompileError(Exception):
    """A kernel source did not compile; the message is the compiler's log."""


@attrs.frozen(kw_only=True)
class CheckResult:
    source: str
    arch: str
    compiler: str
    error: str | None  # None: compiled, and every expected kernel is in the PTX

    @property
    def is_ok(self) -> bool:
        return self.error is None

    def line(self) -> str:
        # One line, whatever the compiler's log spans.
        log = "; ".join(part.strip() for part in (self.error or "").splitlines() if part.strip())
        status = "OK" if self.error is None else f"error: {log}"
        return f"{self.source:<18} {self.arch:<6} {self.compiler:<6} {status}"


def _nvrtc() -> Compile | None:
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception:  # no CuPy, or no libnvrtc it can load
        return None

    def compile_nvrtc(code: str, file_name: str, arch: str) -> str:
        program = nvrtc.createProgram(code, file_name, [], [])
        try:
            try:
                nvrtc.compileProgram(program, [*NVRTC_OPTIONS, f"--gpu-architecture={arch}"])
            except nvrtc.NVRTCError as error:
                raise CompileError(nvrtc.getProgramLog(program).strip() or str(error)) from None
            ptx = nvrtc.getPTX(program)
            return ptx.decode() if isinstance(ptx, bytes) else str(ptx)
        finally:
            nvrtc.destroyProgram(program)

    return compile_nvrtc


def _nvcc() -> Compile | None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None

    def compile_nvcc(code: str, file_name: str, arch: str) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / file_name
            source.write_text(code)
            ptx = Path(tmp) / "out.ptx"
            done = subprocess.run(
                [nvcc, "--ptx", f"-arch={arch}", *NVRTC_OPTIONS, "-o", str(ptx), str(source)],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise CompileError((done.stderr or done.stdout).strip())
            return ptx.read_text()

    return compile_nvcc


COMPILERS: dict[str, Callable[[], Compile | None]] = {"nvrtc": _nvrtc, "nvcc": _nvcc}


def find_compiler(preferred: Sequence[str] = ("nvrtc", "nvcc")) -> tuple[str, Compile] | None:
    """The first of ``preferred`` that loads here, with its name; ``None`` when none does."""
    for name in preferred:
        compile_fn = COMPILERS[name]()
        if compile_fn is not None:
            return name, compile_fn
    return None


def check_source(
    source: KernelSource, code: str, arch: str, compiler: tuple[str, Compile]
) -> CheckResult:
    name, compile_fn = compiler
    try:
        ptx = compile_fn(code, source.file_name, arch)
    except CompileError as error:
        return CheckResult(source=source.name, arch=arch, compiler=name, error=str(error))
    missing = sorted(set(source.functions) - set(_ENTRY.findall(ptx)))
    problem = f"kernels missing from the PTX: {', '.join(missing)}" if missing else None
    return CheckResult(source=source.name, arch=arch, compiler=name, error=problem)


def check_sources(
    compiler: tuple[str, Compile],
    archs: Sequence[str] = ARCHS,
    sources: Sequence[KernelSource] = KERNEL_SOURCES,
) -> list[CheckResult]:
    """One result per source and arch, in that order."""
    return [
        check_source(source, source_code(source), arch, compiler)
        for source in sources
        for arch in archs
    ]
