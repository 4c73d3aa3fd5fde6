"""glibc's malloc, set so a step's activations reuse the memory the last step freed.

torch's CPU tensors come from ``malloc``. By default glibc serves a block above its mmap
threshold (128 KiB, rising to the largest block freed, at most 32 MiB) with a fresh ``mmap``
and returns it at ``free``, and trims the heap's top past 128 KiB: every step then faults in
its activations page by page again. A 2048-token prefill step allocates ~10 such buffers of
up to 25 MiB per layer; their page faults cost a fifth of the step (the default model's
output segment: 60-65 -> 49 ms). With blocks up to 32 MiB kept in the heap and up to 256 MiB of
free top kept per arena, the next step's buffers are pages already mapped.

What stays mapped is what a step used at its widest, which the memory plan prices as the
runtime headroom (activations and attention scratch), so no owner's bytes grow. A user who
sets ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` keeps their own settings.
"""

from __future__ import annotations

import ctypes
import logging
import os

logger = logging.getLogger("metrale.kernels")

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's own ceiling for the threshold on 64-bit
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024
_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_applied: bool | None = None


def retain_step_memory() -> bool:
    """Set glibc's mmap and trim thresholds (once per process); whether they are in force.
    False where the C library has no ``mallopt`` or refuses them (musl's is a stub), or where
    the user set either threshold in the environment."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if any(name in os.environ for name in _USER_SETTINGS):
        logger.debug("malloc thresholds: the environment's (%s)", ", ".join(_USER_SETTINGS))
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the process runs on
    except (OSError, AttributeError):  # none with mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    logger.debug(
        "malloc thresholds: mmap %d, trim %d bytes (%s)",
        MMAP_THRESHOLD_BYTES,
        TRIM_THRESHOLD_BYTES,
        "set" if applied else "refused",
    )
    return applied
