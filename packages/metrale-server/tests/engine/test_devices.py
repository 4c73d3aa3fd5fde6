import pytest
import torch

from metrale_server.devices import resolve_device, resolve_dtype


def test_auto_is_cpu_float32_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    device = resolve_device("auto")
    assert device == torch.device("cpu")
    assert resolve_dtype("auto", device) is torch.float32


def test_auto_dtype_is_bfloat16_on_cuda() -> None:
    assert resolve_dtype("auto", torch.device("cuda")) is torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) is torch.float16


def test_cuda_without_a_device_is_refused() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda:0")


def test_unknown_device_type_is_refused() -> None:
    with pytest.raises(ValueError, match="not supported"):
        resolve_device("meta")
