import os
import shutil
from types import SimpleNamespace
from typing import cast

import attrs
import pytest
import torch

from metrale_config import Int4Method, Int4Quantization, ModelConfig
from metrale_kernels.cpu_features import CpuFeatures
from metrale_model_arch import QUANTIZATION_NAMES, LoadedModel, Quantization
from metrale_server import EngineArgs, devices
from metrale_server.arg_choices import QUANTIZATION_CHOICES
from metrale_server.devices import (
    check_dtype_runs,
    resolve_device,
    resolve_dtype,
    resolve_quantization,
)


def test_auto_is_cpu_float32_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    device = resolve_device("auto")
    assert device == torch.device("cpu")
    assert resolve_dtype("auto", device) is torch.float32


def dtype_config(torch_dtype: str | None) -> ModelConfig:
    return attrs.evolve(q4_tileable_config(gguf_projection_types=()), torch_dtype=torch_dtype)


@pytest.mark.parametrize(
    ("saved", "features", "expected"),
    [
        ("float32", "VNNI", torch.float32),
        ("bfloat16", "AVX512_BF16", torch.bfloat16),  # computed natively: kept
        ("bfloat16", "VNNI", torch.float32),  # no bf16 dot products: float32 holds it exactly
        ("float16", "AVX512_BF16", torch.float32),
        (None, "AVX512_BF16", torch.float32),  # a GGUF names none
    ],
)
def test_auto_dtype_on_a_cpu_is_the_checkpoints_where_it_computes_natively(
    monkeypatch: pytest.MonkeyPatch, saved: str | None, features: str, expected: torch.dtype
) -> None:
    monkeypatch.setattr(devices, "cpu_features", lambda: globals()[features])
    assert resolve_dtype("auto", torch.device("cpu"), dtype_config(saved)) is expected
    assert resolve_dtype("float16", torch.device("cpu"), dtype_config(saved)) is torch.float16


@pytest.mark.parametrize(
    ("saved", "expected"),
    [
        ("bfloat16", torch.bfloat16),
        ("float16", torch.float16),
        ("float32", torch.float32),
        (None, torch.bfloat16),
    ],
)
def test_auto_dtype_on_cuda_is_the_checkpoints(saved: str | None, expected: torch.dtype) -> None:
    assert resolve_dtype("auto", torch.device("cuda"), dtype_config(saved)) is expected


def test_float64_is_for_exactness_checks_on_the_cpu_torch_kernels_only() -> None:
    cpu = torch.device("cpu")
    assert resolve_dtype("float64", cpu) is torch.float64
    assert resolve_dtype("auto", cpu, dtype_config("float64")) is torch.float32  # never chosen
    check_dtype_runs(torch.float64, cpu, "torch")
    for device, backend in ((cpu, "auto"), (cpu, "cpu"), (torch.device("cuda"), "torch")):
        with pytest.raises(ValueError, match="kernel_backend torch only"):
            check_dtype_runs(torch.float64, device, backend)
    check_dtype_runs(torch.float32, cpu, "auto")


def test_cuda_without_a_device_is_refused() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda:0")


def test_unknown_device_type_is_refused() -> None:
    with pytest.raises(ValueError, match="not supported"):
        resolve_device("meta")


VNNI = CpuFeatures(flags=frozenset({"avx2", "avx512f", "avx512_vnni"}), machine="x86_64")
AVX512_BF16 = CpuFeatures(
    flags=frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}), machine="x86_64"
)
AVX2_ONLY = CpuFeatures(flags=frozenset({"avx2", "fma"}), machine="x86_64")
NO_AVX2 = CpuFeatures(flags=frozenset({"sse4_2", "avx"}), machine="x86_64")


@pytest.mark.parametrize(
    ("features", "device", "dtype", "model_type", "expected"),
    [
        # auto never requantizes a float checkpoint: int8 is lossy, asked for only.
        (VNNI, "cpu", torch.float32, "llama", Quantization.NONE),
        (AVX2_ONLY, "cpu", torch.float32, "llama", Quantization.NONE),
        (NO_AVX2, "cpu", torch.float32, "llama", Quantization.NONE),
        (VNNI, "cpu", torch.bfloat16, "llama", Quantization.NONE),
        (VNNI, "cuda", torch.float32, "llama", Quantization.NONE),
        (VNNI, "cpu", torch.float32, "qwen3_moe", Quantization.NONE),
    ],
)
def test_auto_quantization_keeps_a_float_checkpoint_float(
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


AWQ_INT4: dict[str, object] = {
    "quantization_method": "awq",
    "gguf_projection_types": (),
    "int4_quantization": Int4Quantization(method=Int4Method.AWQ, group_size=32),
}


@pytest.mark.parametrize(
    ("changes", "kernel_backend", "expected"),
    [
        ({}, "auto", Quantization.Q4),
        ({}, "cpu", Quantization.Q4),
        ({}, "torch", Quantization.NONE),  # the reference q4 op dequantizes every call
        ({"gguf_projection_types": ("Q4_1", "Q6_K")}, "auto", Quantization.NONE),
        ({"gguf_projection_types": ("Q4_0",)}, "auto", Quantization.NONE),  # not kept exactly
        ({"gguf_projection_types": ()}, "auto", Quantization.NONE),  # safetensors
        ({"intermediate_size": 48}, "auto", Quantization.NONE),  # not whole blocks of 32
        (AWQ_INT4, "auto", Quantization.Q4),  # its 4-bit weights repacked, not a float copy
        (AWQ_INT4, "torch", Quantization.NONE),
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


def test_the_boot_log_says_what_auto_kept_and_the_faster_lossy_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(devices, "cpu_features", lambda: AVX2_ONLY)
    config = dtype_config("float32")
    loaded = cast(
        "LoadedModel",
        SimpleNamespace(
            quantization=Quantization.NONE,
            dtype=torch.float32,
            device=torch.device("cpu"),
            config=config,
        ),
    )
    lines = devices.format_choice_lines(loaded, quantization_flag="auto")
    assert (
        lines[0] == "weights: none (auto keeps the checkpoint's weights in float32; exact to "
        "the checkpoint)"
    )
    assert "--quantization int8" in lines[1]
    assert "perplexity" in lines[1]
    asked = devices.format_choice_lines(loaded, quantization_flag="none")
    assert asked == ["weights: none, as --quantization asked", lines[1]]
    lines = devices.format_choice_lines(loaded, quantization_flag="auto", tensor_parallel_size=2)
    assert lines[1].startswith("over 2 ranks: ")
    assert "float rounding" in lines[1]
    assert len(lines) == 2  # no faster-format hint for a split serve
    loaded.quantization = Quantization.INT8  # type: ignore[misc]
    assert "bit for bit" in devices.SPLIT_EXACTNESS[Quantization.INT8]
    lines = devices.format_choice_lines(loaded, quantization_flag="int8", tensor_parallel_size=2)
    assert lines == [
        "weights: int8, as --quantization asked",
        f"over 2 ranks: {devices.SPLIT_EXACTNESS[Quantization.INT8]}",
    ]
