"""Metrale ops: a backend interface, its torch reference, and helpers the models share."""

from __future__ import annotations

import torch

from metrale_kernels.attention_metadata import AttentionMetadata, build_attention_metadata
from metrale_kernels.backend import KernelBackend
from metrale_kernels.rotary import (
    cos_sin_cache,
    default_inv_freq,
    dynamic_ntk_inv_freq,
    linear_inv_freq,
    llama3_inv_freq,
)
from metrale_kernels.torch_backend import TorchBackend

__all__ = [
    "AttentionMetadata",
    "KernelBackend",
    "TorchBackend",
    "build_attention_metadata",
    "cos_sin_cache",
    "default_inv_freq",
    "dynamic_ntk_inv_freq",
    "get_backend",
    "linear_inv_freq",
    "llama3_inv_freq",
]


def get_backend(device: torch.device | str) -> KernelBackend:
    """The backend for ``device``: the torch reference until a CUDA backend is registered."""
    del device
    return TorchBackend()
