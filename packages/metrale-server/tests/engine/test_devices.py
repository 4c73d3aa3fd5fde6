import pytest
import torch

from metrale_config import ModelConfig
from metrale_kernels.cpu_features import CpuFeatures
from metrale_model_arch import QUANTIZATION_NAMES, Quantization
from metrale_server import EngineArgs, devices
from metrale_server.args import QUANTIZATION_CHOICES
from metrale_server.devices import resolve_device, resolve_dtype, resolve_quantization


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


VNNI = CpuFeatures(flags=frozenset({"avx2", "avx512f", "avx512_vnni"}), machine="x86_64")
AVX2_ONLY = CpuFeatures(flags=frozenset({"avx2", "fma"}), machine="x86_64")
NO_AVX2 = CpuFeatures(flags=frozenset({"sse4_2", "avx"}), machine="x86_64")


@pytest.mark.parametrize(
    ("features", "device", "dtype", "model_type", "expected"),
    [
        (VNNI, "cpu", torch.float32, "llama", Quantization.INT8),
        (AVX2_ONLY, "cpu", torch.float32, "llama", Quantization.INT8),
        (NO_AVX2, "cpu", torch.float32, "llama", Quantization.NONE),
        (VNNI, "cpu", torch.bfloat16, "llama", Quantization.NONE),
        (VNNI, "cuda", torch.float32, "llama", Quantization.NONE),
        (VNNI, "cpu", torch.float32, "qwen3_moe", Quantization.NONE),
    ],
)
def test_auto_quantization_is_int8_only_where_it_is_the_fast_path(
    monkeypatch: pytest.MonkeyPatch,
    features: CpuFeatures,
    device: str,
    dtype: torch.dtype,
    model_type: str,
    expected: Quantization,
) -> None:
    monkeypatch.setattr(devices, "cpu_features", lambda: features)
    config = ModelConfig(
        source="test",
        model_type=model_type,
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        rms_norm_eps=1e-6,
        max_position_embeddings=32,
    )
    assert resolve_quantization("auto", torch.device(device), dtype, config) is expected
    assert resolve_quantization("none", torch.device(device), dtype, config) is Quantization.NONE
    assert resolve_quantization("int8", torch.device(device), dtype, config) is Quantization.INT8


def test_quantization_choices_are_the_model_layers_formats() -> None:
    assert ("auto", *QUANTIZATION_NAMES) == QUANTIZATION_CHOICES
    with pytest.raises(ValueError, match="quantization must be one of auto, none, int8"):
        EngineArgs(quantization="int4")
