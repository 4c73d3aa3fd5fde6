"""Choosing a backend by name for a device: ``torch``, ``cupy`` or ``auto``."""

from __future__ import annotations

import logging

import torch

from metrale_kernels.backend import KernelBackend, TorchBackend

BACKEND_NAMES = ("auto", "torch", "cpu", "cupy")
logger = logging.getLogger("metrale.kernels")


class BackendUnavailableError(RuntimeError):
    """The backend asked for cannot run on this device; the message says why."""


def get_backend(device: torch.device | str, name: str = "auto") -> KernelBackend:
    """``torch``: the reference ops; ``cpu``: native C++ kernels for the CPU (built on the
    machine; raises :class:`BackendUnavailableError` off the CPU or without a C++ compiler);
    ``cupy``: the CUDA kernels (raises off CUDA or where CuPy cannot run); ``auto``: ``cupy`` on
    a CUDA device where it can run, ``cpu`` on the CPU where a compiler is, else ``torch``.
    Raises ``ValueError`` for another name."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"kernel backend must be one of {', '.join(BACKEND_NAMES)}, got {name!r}")
    device = torch.device(device)
    if name == "torch":
        return TorchBackend()
    if name == "cpu" or (name == "auto" and device.type == "cpu"):
        return _cpu_backend(device, required=name == "cpu")
    if name == "auto" and device.type != "cuda":
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


def _cpu_backend(device: torch.device, *, required: bool) -> KernelBackend:
    from metrale_kernels.cpu.backend import CpuBackend
    from metrale_kernels.cpu.build import NativeBuildError, compiler

    if device.type != "cpu":
        raise BackendUnavailableError(f"the cpu kernel backend runs on the CPU, not {device}")
    try:
        compiler()
    except NativeBuildError as error:
        if required:
            raise BackendUnavailableError(f"the cpu kernel backend cannot run: {error}") from None
        logger.debug("kernel backend auto: torch, as %s", error)
        return TorchBackend()
    return CpuBackend()
