import os
import shutil

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


def q4_tileable_config(**changes: object) -> ModelConfig:
    fields: dict[str, object] = {
        "source": "test",
        "model_type": "llama",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32,
        "quantization_method": "gguf",
        "gguf_projection_types": ("Q4_1",),
    }
    return ModelConfig(**{**fields, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "kernel_backend", "expected"),
    [
        ({}, "auto", Quantization.Q4),
        ({}, "cpu", Quantization.Q4),
        ({}, "torch", Quantization.INT8),  # the reference q4 op dequantizes every call
        ({"gguf_projection_types": ("Q4_1", "Q6_K")}, "auto", Quantization.INT8),
        ({"gguf_projection_types": ("Q4_0",)}, "auto", Quantization.INT8),  # not kept exactly
        ({"gguf_projection_types": ()}, "auto", Quantization.INT8),  # safetensors
        ({"intermediate_size": 48}, "auto", Quantization.INT8),  # not whole blocks of 32
    ],
)
def test_auto_quantization_is_q4_for_a_q4_1_gguf_on_the_native_kernels(
    monkeypatch: pytest.MonkeyPatch,
    changes: dict[str, object],
    kernel_backend: str,
    expected: Quantization,
) -> None:
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("the cpu kernel backend needs a C++ compiler")
    monkeypatch.setattr(devices, "cpu_features", lambda: VNNI)
    config = q4_tileable_config(**changes)
    cpu = torch.device("cpu")
    got = resolve_quantization("auto", cpu, torch.float32, config, kernel_backend)
    assert got is expected
    assert resolve_quantization("q4", cpu, torch.float32, config) is Quantization.Q4
    assert resolve_quantization("auto", cpu, torch.bfloat16, config) is Quantization.NONE


def test_quantization_choices_are_the_model_layers_formats() -> None:
    assert ("auto", *QUANTIZATION_NAMES) == QUANTIZATION_CHOICES
    with pytest.raises(ValueError, match="quantization must be one of auto, none, int8, q4"):
        EngineArgs(quantization="int4")
