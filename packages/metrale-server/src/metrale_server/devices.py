"""Choosing the device and activation dtype from the CLI's ``auto`` defaults."""

from __future__ import annotations

import torch

from metrale_config import ModelConfig
from metrale_kernels import BackendUnavailableError, cpu_features, get_backend
from metrale_model_arch import LoadedModel, Quantization
from metrale_model_arch.memory.weights import q4_support_error
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


# A GGUF's ggml types whose blocks q4 keeps bit for bit.
Q4_EXACT_GGML_TYPES = frozenset({"Q4_1"})


def resolve_quantization(
    spec: str,
    device: torch.device,
    dtype: torch.dtype,
    config: ModelConfig,
    kernel_backend: str = "auto",
) -> Quantization:
    """``auto`` is the fastest path measured for a float32 serve on a CPU where int8 matmuls
    beat float32 (``CpuFeatures.int8_matmul``: AVX2 or better, arm64), of a model type with an
    int8 path: ``q4`` for a GGUF whose projections are all Q4_1 (kept bit for bit, 5 bits a
    weight to stream instead of 8) where the native cpu kernels run them and the blocks tile
    every projection; ``int8`` otherwise. ``none`` elsewhere."""
    if spec != "auto":
        return Quantization(spec)
    record = ARCHITECTURES.get(config.model_type)
    if not (
        device.type == "cpu"
        and dtype == torch.float32
        and cpu_features().int8_matmul
        and record is not None
        and record.int8_linears
    ):
        return Quantization.NONE
    if (
        config.gguf_projection_types
        and set(config.gguf_projection_types) <= Q4_EXACT_GGML_TYPES
        and q4_support_error(config) is None
        and _runs_native_cpu_kernels(device, kernel_backend)
    ):
        return Quantization.Q4
    return Quantization.INT8


def _runs_native_cpu_kernels(device: torch.device, kernel_backend: str) -> bool:
    try:
        return get_backend(device, kernel_backend).name == "cpu"
    except (BackendUnavailableError, ValueError):
        return False


def kernel_summary(loaded: LoadedModel) -> str:
    """Which kernels run the matmuls and attention, and the CPU features that chose them."""
    backend = loaded.model.backend
    if loaded.device.type != "cpu":
        return f"{backend.name} backend"
    if loaded.quantization == Quantization.INT8:
        matmul = "int8 x int8 -> int32 matmuls"
    elif loaded.quantization == Quantization.Q4:
        matmul = "q4 (Q4_1 blocks) x int8 -> int32 matmuls, int8 embeddings and head"
    else:
        matmul = f"{str(loaded.dtype).removeprefix('torch.')} matmuls (torch linear)"
        if loaded.dtype == torch.bfloat16 and not cpu_features().bf16_dot:
            matmul += " without AVX512-BF16 or AMX: slow here"
    return f"{matmul}; {backend.describe()}; CPU: {cpu_features().describe()}"
