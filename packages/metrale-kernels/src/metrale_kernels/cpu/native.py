"""Native CPU ops (C++ against torch's ATen, built on first use): ``metrale::int8_mm``,
``metrale::q4_mm``, ``metrale::input_major_mm`` (MoE experts),
``metrale::paged_decode`` and the llama layer ops (``int8_qkv_step``, ``int8_output_step``,
``int8_decode_layer``). :func:`load_native_ops` builds (or finds cached) and loads them once
per process; :class:`metrale_kernels.cpu.backend.CpuBackend` calls them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import attrs
import torch

from metrale_kernels.cpu.build import NativeBuildError, build_library, library_path

__all__ = ["NativeBuildError", "NativeOps", "load_native_ops", "load_native_ops_if_possible"]


@attrs.frozen
class NativeOps:
    path: Path
    int8_path: str  # the int8 kernel's instruction set: avx512_vnni, avx2 or scalar
    q4_path: str  # the q4 kernel's, likewise
    cached: bool  # loaded from an earlier build
    seconds: float  # to build (or find) and load

    def describe(self) -> str:
        how = "cached" if self.cached else f"built in {self.seconds:.1f} s"
        return (
            f"native int8_mm ({self.int8_path}), q4_mm ({self.q4_path}), input_major_mm, "
            f"paged_decode and llama layer ops, {how}"
        )


_lock = threading.Lock()
_loaded: NativeOps | None = None


def load_native_ops(cache_dir: Path | None = None, *, build: bool = True) -> NativeOps | None:
    """Build (unless cached) and load the native ops; the same :class:`NativeOps` after the
    first call. ``build=False``: only a cached build is loaded (milliseconds), else ``None``.
    Raises :class:`NativeBuildError` when they cannot be built or loaded here."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        if not build and not library_path(cache_dir).exists():
            return None
        started = time.perf_counter()
        path, cached = build_library(cache_dir)
        try:
            torch.ops.load_library(str(path))  # type: ignore[no-untyped-call]
        except (OSError, RuntimeError) as error:
            raise NativeBuildError(f"loading {path} failed: {error}") from None
        _register_fakes()
        _loaded = NativeOps(
            path=path,
            int8_path=str(torch.ops.metrale.int8_mm_path()),
            q4_path=str(torch.ops.metrale.q4_mm_path()),
            cached=cached,
            seconds=time.perf_counter() - started,
        )
        return _loaded


def load_native_ops_if_possible() -> NativeOps | None:
    """:func:`load_native_ops`, or ``None`` where they cannot be built here."""
    try:
        return load_native_ops()
    except NativeBuildError:
        return None


def _register_fakes() -> None:
    # Shapes for torch.compile's tracing: the compiled layer steps call int8_mm.
    @torch.library.register_fake("metrale::int8_mm")  # type: ignore[untyped-decorator]
    def _int8_mm_fake(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return a.new_empty((a.shape[0], w.shape[0]), dtype=torch.int32)

    @torch.library.register_fake("metrale::q4_mm")  # type: ignore[untyped-decorator]
    def _q4_mm_fake(
        x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return x.new_empty((x.shape[0], packed.shape[0] * scales.shape[-1]))
