"""Choosing the device and activation dtype from the CLI's ``auto`` defaults."""

from __future__ import annotations

import torch

from metrale_config import ModelConfig
from metrale_kernels import BackendUnavailableError, cpu_features, get_backend
from metrale_model_arch import LoadedModel, Quantization
from metrale_model_arch.fp8_support import fp8_serve_error, fp8_weights_line
from metrale_model_arch.int4_format import has_input_order
from metrale_model_arch.memory.weights import q4_support_error
from metrale_model_arch.registry import ARCHITECTURES
from metrale_server.arg_choices import DTYPE_NAMES, EXACTNESS_DTYPE_NAME

DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in (*DTYPE_NAMES, EXACTNESS_DTYPE_NAME)
}


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


def resolve_dtype(
    spec: str, device: torch.device, config: ModelConfig | None = None
) -> torch.dtype:
    """``auto`` is the checkpoint's own dtype (``config.torch_dtype``) where the device computes
    it natively: on CUDA bf16, fp16 and fp32 as saved (bf16 when the config names none, e.g. a
    GGUF); on a CPU bf16 only where it has bf16 dot products (AVX512-BF16, AMX), else float32,
    which holds a bf16 or fp16 weight exactly. Never a lossy cast the user did not ask for."""
    if spec != "auto":
        if spec not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {spec!r}")
        return DTYPES[spec]
    saved_name = config.torch_dtype if config is not None else None
    saved = DTYPES[saved_name] if saved_name in DTYPE_NAMES else None
    if device.type == "cuda":
        return saved if saved is not None else torch.bfloat16
    if saved == torch.bfloat16 and cpu_features().bf16_dot:
        return torch.bfloat16
    return torch.float32


def check_dtype_runs(dtype: torch.dtype, device: torch.device, kernel_backend: str) -> None:
    """Raises ``ValueError`` where ``dtype`` cannot run: float64 (exactness checks) runs only on
    the CPU with the torch reference kernels; the native and CUDA kernels stop at float32."""
    if dtype == torch.float64 and (device.type != "cpu" or kernel_backend != "torch"):
        raise ValueError(
            f"dtype {EXACTNESS_DTYPE_NAME} (for exactness checks) runs on the cpu with "
            f"kernel_backend torch only, not on {device} with kernel_backend {kernel_backend}"
        )


# A GGUF's ggml types whose blocks q4 keeps bit for bit.
Q4_EXACT_GGML_TYPES = frozenset({"Q4_1"})


def resolve_quantization(
    spec: str,
    device: torch.device,
    dtype: torch.dtype,
    config: ModelConfig,
    kernel_backend: str = "auto",
) -> Quantization:
    """``auto`` keeps the checkpoint's own format: ``q4`` for a GGUF whose projections are all
    Q4_1 (its blocks kept bit for bit) or an AWQ/GPTQ int4 checkpoint (repacked to Q4_1 blocks,
    ``metrale_model_arch.int4_blocks``) where the native cpu kernels run them and the blocks tile
    every projection, a float32 serve on a CPU with int8 dot products or AVX2; ``none`` (the
    weights in ``dtype``) for everything else. ``int8``, ``q4`` and ``fp8`` of a float checkpoint
    are lossy and only ever asked for (:func:`faster_format_hint` says when they would be
    faster); ``fp8`` where it cannot run raises ``ValueError`` naming the flag."""
    if spec == Quantization.FP8 and (error := fp8_serve_error(config, device, dtype)) is not None:
        raise ValueError(f"--quantization fp8: {error}")
    if spec != "auto":
        return Quantization(spec)
    if _keeps_q4_blocks(device, dtype, config, kernel_backend):
        return Quantization.Q4
    return Quantization.NONE


def _keeps_q4_blocks(
    device: torch.device, dtype: torch.dtype, config: ModelConfig, kernel_backend: str
) -> bool:
    record = ARCHITECTURES.get(config.model_type)
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and cpu_features().int8_matmul
        and record is not None
        and bool(record.int8_linears)
        and (
            config.int4_quantization is not None
            or (
                bool(config.gguf_projection_types)
                and set(config.gguf_projection_types) <= Q4_EXACT_GGML_TYPES
            )
        )
        and q4_support_error(config) is None
        and _runs_native_cpu_kernels(device, kernel_backend)
    )


# Measured with ``benches/format_quality.py`` (SmolLM2-135M, benches/data, all tokens): int8
# weights cost +1.3% perplexity against float32 (22.435 vs 22.144).
INT8_PERPLEXITY_COST = "+1.3% perplexity (SmolLM2-135M)"


def faster_format_hint(
    quantization: Quantization, device: torch.device, dtype: torch.dtype, config: ModelConfig
) -> str | None:
    """The flag that would serve this model faster (lossy, so never chosen by ``auto``), with
    its measured cost; None where the chosen format is already the fast one."""
    record = ARCHITECTURES.get(config.model_type)
    if (
        quantization != Quantization.NONE
        or device.type != "cpu"
        or dtype != torch.float32
        or not cpu_features().int8_matmul
        or record is None
        or not record.int8_linears
    ):
        return None
    return (
        "--quantization int8 would decode about 2x faster here (int8 weights, lossy: "
        f"{INT8_PERPLEXITY_COST})"
    )


def _runs_native_cpu_kernels(device: torch.device, kernel_backend: str) -> bool:
    try:
        return get_backend(device, kernel_backend).name == "cpu"
    except (BackendUnavailableError, ValueError):
        return False


# What a split over ranks keeps of one process's logits, by weight format.
SPLIT_EXACTNESS = {
    Quantization.NONE: (
        "o_proj's and down_proj's float partial products add over the ranks: one process's "
        "logits up to float rounding"
    ),
    Quantization.INT8: (
        "int8 rows scaled over the whole row, int32 partial sums added: one process's products "
        "bit for bit (the rest up to float rounding)"
    ),
    Quantization.Q4: (
        "activations in digits over the whole row, q4's float partial products added: one "
        "process's logits up to float rounding"
    ),
}


def format_choice_lines(
    loaded: LoadedModel, *, quantization_flag: str, tensor_parallel_size: int = 1
) -> list[str]:
    """The boot log's word on the weight format: what ``auto`` kept and why, what a split over
    ranks changes, and the flag that would be faster (with its cost) where there is one."""
    split = tensor_parallel_size > 1
    if quantization_flag != "auto":
        lines = [f"weights: {loaded.quantization}, as --quantization asked"]
    else:
        int4 = loaded.config.int4_quantization
        exact = "exact to the checkpoint"
        if loaded.quantization == Quantization.Q4 and int4 is not None:
            kept = f"the {int4.describe()} weights as q4 blocks"
            exact = "zero points as float16 minimums, embeddings and head int8"
        elif loaded.quantization == Quantization.Q4:
            kept = "the GGUF's Q4_1 blocks, bit for bit"
        elif int4 is not None:
            kept = f"the {int4.describe()} weights dequantized to {_dtype_name(loaded.dtype)}"
        elif (fp8 := loaded.config.fp8_quantization) is not None:
            kept = (
                f"the {fp8.describe()} dequantized to {_dtype_name(loaded.dtype)} at load "
                "(W8A16; --quantization fp8 keeps them fp8, W8A8)"
            )
        else:
            kept = f"the checkpoint's weights in {_dtype_name(loaded.dtype)}"
        lines = [f"weights: {loaded.quantization} (auto keeps {kept}; {exact})"]
    if loaded.quantization == Quantization.FP8:
        lines.append(fp8_weights_line(loaded.config, loaded.dtype, loaded.device))
    if loaded.quantization == Quantization.Q4 and has_input_order(loaded.config):
        lines.append(
            "GPTQ desc_act: each q4 projection gathers its inputs in g_idx order, so the "
            "native layer executor (plain q4 projections) leaves these layers to the others"
        )
    if split:
        lines.append(f"over {tensor_parallel_size} ranks: {SPLIT_EXACTNESS[loaded.quantization]}")
    hint = faster_format_hint(loaded.quantization, loaded.device, loaded.dtype, loaded.config)
    if hint is not None and not split:
        lines.append(hint)
    return lines


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def kernel_summary(loaded: LoadedModel) -> str:
    """Which kernels run the matmuls and attention, and the CPU features that chose them."""
    backend = loaded.model.backend
    if loaded.device.type != "cpu":
        return f"{backend.name} backend"
    if loaded.quantization == Quantization.INT8:
        matmul = "int8 x int8 -> int32 matmuls"
    elif loaded.quantization == Quantization.Q4:
        matmul = "q4 (Q4_1 blocks) x int8 -> int32 matmuls, int8 embeddings and head"
    elif loaded.quantization == Quantization.FP8:
        matmul = "fp8 x fp8 per-token torch._scaled_mm (the weight converted every call: slow)"
    else:
        matmul = f"{str(loaded.dtype).removeprefix('torch.')} matmuls (torch linear)"
        if loaded.dtype == torch.bfloat16 and not cpu_features().bf16_dot:
            matmul += " without AVX512-BF16 or AMX: slow here"
    return f"{matmul}; {backend.describe()}; CPU: {cpu_features().describe()}"
