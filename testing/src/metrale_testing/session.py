"""Session set-up that several test trees ask for (each opts in from its conftest)."""

from __future__ import annotations

import os

import pytest


def stay_eager() -> None:
    """Engines built by the tests (and servers started from them) stay eager: a test that wants
    the compiled layer steps asks for them with ``enforce_eager=False``."""
    os.environ.setdefault("METRALE_ENFORCE_EAGER", "1")


def build_native_ops_first(session: pytest.Session) -> None:
    """A ``pytest_sessionstart`` hook: build the native CPU ops before any test, so every engine
    loads them at start (a build racing the first tests would swap kernels mid-run).

    A conftest opts in with ``from metrale_testing import build_native_ops_first as
    pytest_sessionstart``."""
    del session
    from metrale_kernels.cpu.native import load_native_ops_if_possible

    load_native_ops_if_possible()  # else the reference ops serve; the cpu backend's tests say why
