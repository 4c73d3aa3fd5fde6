from __future__ import annotations

import pytest
import torch

from metrale_kernels import BackendUnavailableError, TorchBackend, get_backend


def test_auto_is_the_reference_off_cuda() -> None:
    assert type(get_backend("cpu")) is TorchBackend
    assert type(get_backend("cpu", "auto")) is TorchBackend
    assert type(get_backend(torch.device("cpu"), "torch")) is TorchBackend


def test_cupy_off_cuda_says_it_needs_a_cuda_device() -> None:
    with pytest.raises(BackendUnavailableError, match="needs a CUDA device"):
        get_backend("cpu", "cupy")


def test_an_unknown_name_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="auto, torch, cupy"):
        get_backend("cpu", "triton")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-device path")
def test_auto_on_a_cuda_device_without_cupy_support_is_the_reference() -> None:
    # No device here: CuPy (when installed) sees none, so auto settles on torch.
    assert type(get_backend("cuda", "auto")) is TorchBackend
    with pytest.raises(BackendUnavailableError, match="cannot run"):
        get_backend("cuda", "cupy")
