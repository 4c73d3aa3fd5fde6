"""Choosing a backend by name for a device: ``torch``, ``cupy`` or ``auto``."""

from __future__ import annotations

import logging

import torch

from metrale_kernels.backend import KernelBackend, TorchBackend

BACKEND_NAMES = ("auto", "torch", "cupy")
logger = logging.getLogger("metrale.kernels")


class BackendUnavailableError(RuntimeError):
    """The backend asked for cannot run on this device; the message says why."""


def get_backend(device: torch.device | str, name: str = "auto") -> KernelBackend:
    """``torch``: the reference ops; ``cupy``: the CUDA kernels (raises
    :class:`BackendUnavailableError` off CUDA or where CuPy cannot run); ``auto``: ``cupy`` on a
    CUDA device where it can run, else ``torch``. Raises ``ValueError`` for another name."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"kernel backend must be one of {', '.join(BACKEND_NAMES)}, got {name!r}")
    device = torch.device(device)
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return TorchBackend()
    if device.type != "cuda":
        raise BackendUnavailableError(f"the cupy kernel backend needs a CUDA device, not {device}")
    from metrale_kernels.cuda.backend import CupyBackend
    from metrale_kernels.cuda.launch import CupyUnavailableError

    try:
        return CupyBackend()
    except CupyUnavailableError as error:
        if name == "cupy":
            raise BackendUnavailableError(f"the cupy kernel backend cannot run: {error}") from None
        logger.debug("kernel backend auto: torch, as %s", error)
        return TorchBackend()
