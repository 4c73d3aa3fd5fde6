"""Building the native CPU ops: C++ sources compiled on the machine that runs them, cached.

The sources are compiled with ``-march=native``, so the instruction set is the CPU's own
(AVX-512 VNNI, AVX2 or plain C, chosen by the preprocessor), against the running torch's
headers, and loaded with ``torch.ops.load_library`` (its torch libraries resolve to the ones
already loaded). A build is cached under a key of everything it depends on (sources, flags,
compiler, torch, the CPU's flags), so a second start loads it in milliseconds; two processes
building at once each write their own file and rename it in place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from metrale_kernels.cpu_features import cpu_features

SOURCE_DIR = Path(__file__).parent
SOURCES = ("int8_mm.cpp", "q4_mm.cpp", "paged_decode.cpp", "llama_layer.cpp")
HEADERS = ("decode_attention.h", "int8_mm.h", "q4_mm.h", "two_digits.h", "vec_math.h")
# -fopenmp: at::parallel_for is an inline "omp parallel" (run by torch's OpenMP runtime, the
# process's one).
# -ffp-contract=off: no fused multiply-adds the source does not write (results must not depend
# on the compiler's mood); -fno-math-errno lets exp vectorize.
FLAGS = (
    "-O3",
    "-std=c++17",
    "-fPIC",
    "-shared",
    "-fopenmp",
    "-fno-math-errno",
    "-ffp-contract=off",
    "-w",
)
LIBRARY_STEM = "metrale_native"
# The METRALE_NATIVE_MARCH lever (declared in metrale-config): the -march to build for.
MARCH_LEVER = "METRALE_NATIVE_MARCH"


def march_flag() -> str:
    return f"-march={os.environ.get(MARCH_LEVER) or 'native'}"


class NativeBuildError(RuntimeError):
    """The native ops could not be built or loaded here; the message says why."""


def default_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "metrale" / "native"


def compiler() -> str:
    found = shutil.which(os.environ.get("CXX", "c++"))
    if found is None:
        raise NativeBuildError("no C++ compiler (c++ or $CXX) on the PATH")
    return found


def _compiler_version(cxx: str) -> str:
    try:
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise NativeBuildError(f"{cxx} --version failed: {error}") from None
    return done.stdout.splitlines()[0] if done.stdout else ""


def build_key(cxx: str) -> str:
    """A digest of everything the built library depends on."""
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        digest.update((SOURCE_DIR / name).read_bytes())
    for part in (
        *FLAGS,
        march_flag(),
        _compiler_version(cxx),
        torch.__version__,
        sys.version,
        " ".join(sorted(cpu_features().flags)),
    ):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def _command(cxx: str, output: Path) -> list[str]:
    torch_dir = Path(torch.__file__).parent
    include = torch_dir / "include"
    abi = int(torch.compiled_with_cxx11_abi())
    return [
        cxx,
        *FLAGS,
        march_flag(),
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{include}",
        f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
        *(str(SOURCE_DIR / name) for name in SOURCES),
        "-o",
        str(output),
        f"-L{torch_dir / 'lib'}",
        "-lc10",
        "-ltorch_cpu",
    ]


def library_path(cache_dir: Path | None = None) -> Path:
    """Where this machine's build lives (it may not exist yet). Raises
    :class:`NativeBuildError` when there is no compiler."""
    cxx = compiler()
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    return cache_dir / f"{LIBRARY_STEM}-{build_key(cxx)}.so"


def build_library(cache_dir: Path | None = None) -> tuple[Path, bool]:
    """The path of the built library, compiling it unless cached; and whether it was cached.

    Raises :class:`NativeBuildError` when there is no compiler or the compile fails.
    """
    path = library_path(cache_dir)
    if path.exists():
        return path, True
    cache_dir = path.parent
    cache_dir.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=cache_dir, prefix=f".{LIBRARY_STEM}-", suffix=".so")
    os.close(handle)
    try:
        done = subprocess.run(
            _command(compiler(), Path(partial)), capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-12:])
            raise NativeBuildError(f"compiling the native CPU ops failed:\n{tail}")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return path, False
