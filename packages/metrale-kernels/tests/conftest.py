"""Tests marked ``gpu`` run only where torch sees a CUDA device; elsewhere they are skipped.

The native CPU ops' tests skip only where no C++ compiler is on the PATH: with one, a build or
load that fails is a failure, never a skip."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from metrale_kernels.cpu.build import compiler
from metrale_kernels.cpu.native import NativeBuildError, NativeOps, load_native_ops


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: torch.cuda.is_available() is False")


def _native_ops_or_skip() -> NativeOps:
    try:
        compiler()
    except NativeBuildError as error:
        pytest.skip(f"the native CPU ops need a C++ compiler: {error}")
    ops = load_native_ops()  # raises NativeBuildError: the test fails
    assert ops is not None  # build=True: built or raised
    return ops


@pytest.fixture(scope="session")
def native_ops_or_skip() -> Callable[[], NativeOps]:
    """What :func:`native_ops` calls, for the test of the skip itself."""
    return _native_ops_or_skip


@pytest.fixture(scope="session")
def native_ops() -> NativeOps:
    """The native CPU ops, built (or found cached) and loaded."""
    return _native_ops_or_skip()
