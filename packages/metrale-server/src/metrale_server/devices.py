"""Choosing the device and activation dtype from the CLI's ``auto`` defaults."""

from __future__ import annotations

import torch

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


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """``auto`` is float32 on CPU (bf16 matmuls are slow there) and bfloat16 on CUDA."""
    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[spec]
