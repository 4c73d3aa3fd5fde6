"""Building the native CPU ops: C++ sources compiled on the machine that runs them, cached.

The sources are compiled with ``-march=native``, so the instruction set is the CPU's own
(AVX-512 VNNI, AVX2 or plain C, chosen by the preprocessor), against the running torch's
headers, and loaded with ``torch.ops.load_library`` (its torch libraries resolve to the ones
already loaded). Each source compiles on its own (one compiler per CPU this process may use,
each source logged as it ends: a cold build takes tens of seconds), then they are linked. A
build is cached under a key of everything it depends on (sources, flags, compiler, torch, the
CPU's flags), so a second start loads it in milliseconds; two processes building at once each
write their own file and rename it in place.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import torch

from metrale_kernels.cpu_features import cpu_features

logger = logging.getLogger("metrale.kernels")
SOURCE_DIR = Path(__file__).parent
SOURCES = (
    "int8_mm.cpp",
    "q4_mm.cpp",
    "paged_decode.cpp",
    "llama_layer.cpp",
    "input_major_mm.cpp",
)
HEADERS = (
    "decode_attention.h",
    "int8_mm.h",
    "kv_cache.h",
    "q4_mm.h",
    "two_digits.h",
    "vec_math.h",
)
# -fopenmp: at::parallel_for is an inline "omp parallel" (run by torch's OpenMP runtime, the
# process's one).
# -ffp-contract=off: no fused multiply-adds the source does not write (results must not depend
# on the compiler's mood); -fno-math-errno lets exp vectorize.
FLAGS = (
    "-O3",
    "-std=c++17",
    "-fPIC",
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


def _compile_command(cxx: str, source: str, output: Path) -> list[str]:
    include = Path(torch.__file__).parent / "include"
    abi = int(torch.compiled_with_cxx11_abi())
    return [
        cxx,
        *FLAGS,
        march_flag(),
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{include}",
        f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
        "-c",
        str(SOURCE_DIR / source),
        "-o",
        str(output),
    ]


def _link_command(cxx: str, objects: list[Path], output: Path) -> list[str]:
    torch_lib = Path(torch.__file__).parent / "lib"
    return [
        cxx,
        *FLAGS,
        march_flag(),
        "-shared",
        *(str(path) for path in objects),
        "-o",
        str(output),
        f"-L{torch_lib}",
        "-lc10",
        "-ltorch_cpu",
    ]


def build_jobs() -> int:
    """How many sources compile at once: the CPUs this process may run on, at most one per
    source."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(len(SOURCES), cpus or 1))


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-12:])
        raise NativeBuildError(f"{what} failed:\n{tail}")


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
    cxx = compiler()
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{LIBRARY_STEM}-") as scratch:
        objects = {name: Path(scratch) / f"{Path(name).stem}.o" for name in SOURCES}
        with ThreadPoolExecutor(build_jobs(), thread_name_prefix="metrale-native-cc") as pool:
            compiles = {
                pool.submit(_run, _compile_command(cxx, name, output), f"compiling {name}"): name
                for name, output in objects.items()
            }
            for count, compiled in enumerate(as_completed(compiles), start=1):
                compiled.result()
                logger.info(
                    "native CPU ops: compiled %s (%d/%d sources, %.0f s)",
                    compiles[compiled],
                    count,
                    len(SOURCES),
                    time.perf_counter() - started,
                )
        partial = Path(scratch) / path.name
        _run(_link_command(cxx, list(objects.values()), partial), "linking the native CPU ops")
        os.replace(partial, path)
    return path, False
