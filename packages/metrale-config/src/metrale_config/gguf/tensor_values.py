"""The few GGUF tensors whose values are config, not weights (Phi-3's LongRoPE factors)."""

from __future__ import annotations

from typing import cast

from metrale_config.errors import ConfigError
from metrale_config.gguf.header import GgufHeader
from metrale_config.gguf.values import shortest_float32s


def read_float32_vector(header: GgufHeader, name: str) -> tuple[float, ...]:
    """The values of the 1-D F32 tensor ``name`` in ``header``'s file, each as the shortest
    decimal that is the same float32 (as metadata floats read), or ``ConfigError`` naming it."""
    info = header.tensor(name)
    if info is None:
        raise ConfigError(f"{header.source}: tensor {name!r} is missing")
    if info.ggml_type != "F32" or len(info.shape) != 1:
        raise ConfigError(
            f"{header.source}: tensor {name!r} must be a 1-D F32 tensor, "
            f"got {info.ggml_type} of shape {info.shape}"
        )
    try:
        with open(header.path, "rb") as file:
            file.seek(info.data_offset)
            raw = file.read(info.num_bytes)
    except OSError as exc:
        raise ConfigError(f"{header.source}: cannot be read ({exc})") from exc
    if len(raw) != info.num_bytes:
        raise ConfigError(f"{header.source}: truncated in the data of tensor {name!r}")
    return tuple(cast("list[float]", shortest_float32s(raw, "<")))
