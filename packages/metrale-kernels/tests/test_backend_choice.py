from __future__ import annotations

import os
import shutil

import pytest
import torch

from metrale_kernels import BackendUnavailableError, TorchBackend, get_backend
from metrale_kernels.cpu.backend import CpuBackend

HAS_COMPILER = shutil.which(os.environ.get("CXX", "c++")) is not None


@pytest.mark.skipif(not HAS_COMPILER, reason="needs a C++ compiler")
def test_auto_on_the_cpu_is_the_native_cpu_backend() -> None:
    assert type(get_backend("cpu")) is CpuBackend
    assert type(get_backend("cpu", "auto")) is CpuBackend
    assert type(get_backend("cpu", "cpu")) is CpuBackend
    assert type(get_backend(torch.device("cpu"), "torch")) is TorchBackend


def test_without_a_compiler_auto_is_the_reference_and_cpu_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert type(get_backend("cpu", "auto")) is TorchBackend
    with pytest.raises(BackendUnavailableError, match="no C\\+\\+ compiler"):
        get_backend("cpu", "cpu")


def test_the_cpu_backend_runs_on_the_cpu_only() -> None:
    with pytest.raises(BackendUnavailableError, match="runs on the CPU"):
        get_backend("cuda", "cpu")


def test_cupy_off_cuda_says_it_needs_a_cuda_device() -> None:
    with pytest.raises(BackendUnavailableError, match="needs a CUDA device"):
        get_backend("cpu", "cupy")


def test_an_unknown_name_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="auto, torch, cpu, cupy"):
        get_backend("cpu", "triton")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-device path")
def test_auto_on_a_cuda_device_without_cupy_support_is_the_reference() -> None:
    # No device here: CuPy (when installed) sees none, so auto settles on torch.
    assert type(get_backend("cuda", "auto")) is TorchBackend
    with pytest.raises(BackendUnavailableError, match="cannot run"):
        get_backend("cuda", "cupy")
