"""``CupyBackend``: the ops with CUDA kernels, each falling back to the torch reference for an
input its kernel does not take (said once per op and reason in a debug line).

The kernels live one module per ``kernels/<family>.cu`` source; this class only names them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from metrale_kernels.backend import KernelBackend
from metrale_kernels.cuda import (
    activation,
    dsa,
    dsa_indexer,
    dsa_select,
    kv_write,
    moe_routing,
    norms,
    paged_attention,
    rotary,
)
from metrale_kernels.cuda.launch import import_cupy
from metrale_kernels.op import Op, kernels_in

logger = logging.getLogger("metrale.kernels")
P = ParamSpec("P")
R = TypeVar("R")

KERNEL_FAMILIES = (
    norms,
    activation,
    rotary,
    kv_write,
    paged_attention,
    moe_routing,
    dsa,
    dsa_indexer,
    dsa_select,
)


class CupyBackend(KernelBackend, kernels=kernels_in(*KERNEL_FAMILIES)):
    """CUDA kernels through CuPy (see :mod:`metrale_kernels.cuda.sources`); every op it has no
    kernel for is the reference. Raises :class:`~metrale_kernels.cuda.launch.CupyUnavailableError`
    when CuPy cannot run here."""

    name = "cupy"

    def __init__(self) -> None:
        import_cupy()
        self._fallbacks_logged: set[tuple[str, str]] = set()
        inherited = type(self).reference_ops()
        logger.debug("cupy backend: the torch reference runs %s", ", ".join(inherited))

    def fallback(self, op: Op[P, R], reason: str) -> Callable[P, R]:
        if (op.name, reason) not in self._fallbacks_logged:
            self._fallbacks_logged.add((op.name, reason))
            logger.debug("cupy backend: %s falls back to the torch reference: %s", op.name, reason)
        return op.reference
