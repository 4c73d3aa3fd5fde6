"""Choosing the device and activation dtype from the CLI's ``auto`` defaults."""

from __future__ import annotations

import torch

from metrale_config import ModelConfig
from metrale_kernels import BackendUnavailableError, cpu_features, get_backend
from metrale_model_arch import LoadedModel, Quantization
from metrale_model_arch.registry import ARCHITECTURES
from metrale_server.args import DTYPE_NAMES

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}


def resolve_device(spec: str) -> torch.device:
    """``auto`` is the first CUDA device when one is present, else the CPU."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {spec!r} requested but CUDA is not available")
    if device.type not in {"cpu", "cuda"}:
        raise ValueError(f"device {spec!r} is not supported (use cpu, cuda or cuda:N)")
    return device


def check_kernel_backend(spec: str, device: torch.device) -> None:
    """Raises ``ValueError`` saying why kernel backend ``spec`` cannot run on ``device``."""
    try:
        get_backend(device, spec)
    except BackendUnavailableError as error:
        raise ValueError(f"{error}; use --kernel-backend torch or auto") from None


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """``auto`` is float32 on CPU (bf16 matmuls are slow there) and bfloat16 on CUDA."""
    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[spec]


def resolve_quantization(
    spec: str, device: torch.device, dtype: torch.dtype, config: ModelConfig
) -> Quantization:
    """``auto`` is int8 where it is the fastest path measured: on a CPU where int8 matmuls beat
    float32 (``CpuFeatures.int8_matmul``: AVX2 or better, arm64), for a float32 serve of a model
    type with an int8 path."""
    if spec != "auto":
        return Quantization(spec)
    record = ARCHITECTURES.get(config.model_type)
    if (
        device.type == "cpu"
        and dtype == torch.float32
        and cpu_features().int8_matmul
        and record is not None
        and record.int8_linears
    ):
        return Quantization.INT8
    return Quantization.NONE


def kernel_summary(loaded: LoadedModel) -> str:
    """Which kernels run the matmuls and attention, and the CPU features that chose them."""
    backend = loaded.model.backend
    if loaded.device.type != "cpu":
        return f"{backend.name} backend"
    if loaded.quantization == Quantization.INT8:
        matmul = "int8 x int8 -> int32 matmuls"
    else:
        matmul = f"{str(loaded.dtype).removeprefix('torch.')} matmuls (torch linear)"
        if loaded.dtype == torch.bfloat16 and not cpu_features().bf16_dot:
            matmul += " without AVX512-BF16 or AMX: slow here"
    return f"{matmul}; {backend.describe()}; CPU: {cpu_features().describe()}"
