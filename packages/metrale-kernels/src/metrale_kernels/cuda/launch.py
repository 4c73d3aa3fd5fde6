"""Compiled kernels by name, launched on torch's current stream with torch tensors' pointers.

Each source is compiled once per device by ``cupy.RawModule`` (NVRTC, the options of
:mod:`~metrale_kernels.cuda.sources`; CuPy also keeps the binaries in its on-disk cache).
Tensors are passed zero-copy as raw device pointers: the kernels index them with the strides
they are given, so the caller keeps each tensor alive until the launch is queued.
"""

from __future__ import annotations

from typing import Any

import torch

from metrale_kernels.cuda.sources import NVRTC_OPTIONS, SOURCES_BY_NAME, source_code

# The dynamic shared memory a block gets without opting in.
MAX_SHARED_BYTES = 48 * 1024
_SUFFIXES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_KV_FORMAT_SUFFIXES = {torch.int8: "i8", torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
_functions: dict[tuple[str, int], Any] = {}
_modules: dict[tuple[str, int], Any] = {}
_streams: dict[tuple[int, int], Any] = {}
_usable_cupy: list[Any] = []  # the cupy module, once it has been found usable


class CupyUnavailableError(RuntimeError):
    """CuPy cannot be imported, or sees no CUDA device."""


def import_cupy() -> Any:
    """The ``cupy`` module; raises :class:`CupyUnavailableError` saying why it cannot be used."""
    try:
        import cupy
    except ImportError as error:
        raise CupyUnavailableError(
            f"cannot import cupy ({error}); install metrale-kernels[cuda] (cupy-cuda12x) or "
            "cupy-cuda13x"
        ) from None
    if not cupy.cuda.is_available():
        raise CupyUnavailableError("cupy is installed but sees no CUDA device")
    _usable_cupy[:] = [cupy]
    return cupy


def dtype_suffix(dtype: torch.dtype) -> str | None:
    """The kernel name suffix for ``dtype``; ``None`` when no kernel takes it."""
    return _SUFFIXES.get(dtype)


def kv_format_suffix(dtype: torch.dtype) -> str | None:
    """The kernel name's format for a quantized K/V cache of ``dtype``; ``None`` for any other."""
    return _KV_FORMAT_SUFFIXES.get(dtype)


def on_cuda(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda


def into(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``result``, or copied into ``out`` (an op's ``out=``) and that returned."""
    if out is None:
        return result
    return out.copy_(result)


def _kernel(cupy: Any, source: str, function: str, device: int) -> Any:
    kernel = _functions.get((function, device))
    if kernel is None:
        module = _modules.get((source, device))
        if module is None:
            code = source_code(SOURCES_BY_NAME[source])
            module = cupy.RawModule(code=code, options=NVRTC_OPTIONS, backend="nvrtc")
            _modules[(source, device)] = module
        kernel = module.get_function(function)
        _functions[(function, device)] = kernel
    return kernel


def ptr(tensor: torch.Tensor) -> Any:
    import numpy

    return numpy.uint64(tensor.data_ptr())


class StreamHandle:
    """A CUDA stream handle under the CUDA stream protocol (``__cuda_stream__``: version 0 and
    the handle), which cupy 14's ``Stream.from_external`` reads."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def cupy_stream(cupy: Any, handle: int, index: int) -> Any:
    """A cupy stream over the CUDA stream ``handle`` (torch's) of device ``index``: cupy 14's
    ``Stream.from_external`` (its ``ExternalStream`` is deprecated), cupy 13's
    ``ExternalStream``. Used inside ``cupy.cuda.Device(index)``: the stream's device is then
    the current one."""
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is None:
        return cupy.cuda.ExternalStream(handle, index)
    return from_external(StreamHandle(handle))


def i32(value: int) -> Any:
    import numpy

    return numpy.int32(value)


def i64(value: int) -> Any:
    import numpy

    return numpy.int64(value)


def f32(value: float) -> Any:
    import numpy

    return numpy.float32(value)


def launch(
    source: str,
    function: str,
    device: torch.device,
    grid: tuple[int, ...],
    block: tuple[int, ...],
    args: tuple[Any, ...],
    *,
    shared_mem_bytes: int = 0,
) -> None:
    """Queue ``function`` of ``source`` on ``device``'s current torch stream."""
    cupy = _usable_cupy[0] if _usable_cupy else import_cupy()
    index = device.index if device.index is not None else torch.cuda.current_device()
    with cupy.cuda.Device(index):
        kernel = _kernel(cupy, source, function, index)
        handle = torch.cuda.current_stream(index).cuda_stream
        stream = _streams.get((index, handle))
        if stream is None:
            stream = _streams[(index, handle)] = cupy_stream(cupy, handle, index)
        with stream:
            kernel(grid, block, args, shared_mem=shared_mem_bytes)
