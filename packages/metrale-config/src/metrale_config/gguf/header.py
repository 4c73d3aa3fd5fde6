"""A GGUF file's metadata and tensor index, parsed straight from the file's bytes.

Layout: magic ``GGUF``, ``u32`` version, ``u64`` tensor count, ``u64`` key/value count; each
key/value pair (string key, ``u32`` value type, value); each tensor's index entry (string name,
``u32`` number of dims, ``u64`` per dim innermost first, ``u32`` ggml type, ``u64`` offset into the
data); then the tensor data, from the next multiple of ``general.alignment``.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import attrs

from metrale_config.errors import ConfigError
from metrale_config.gguf.values import GgufBytes, GgufCursor, GgufValueType, MalformedGgufError

ARCHITECTURE_KEY = "general.architecture"
ALIGNMENT_KEY = "general.alignment"
SUPPORTED_VERSIONS: Final = (2, 3)
_MAGIC: Final = b"GGUF"
_DEFAULT_ALIGNMENT: Final = 32
# The smallest key/value pair (empty key, a one-byte value) and index entry (empty name, no dims).
_MIN_FIELD_BYTES: Final = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES: Final = 8 + 4 + 4 + 8


@attrs.frozen(kw_only=True)
class GgufTensorInfo:
    """One tensor of the index; ``shape`` is row-major (PyTorch order, GGUF's dims reversed)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: str
    num_bytes: int
    data_offset: int


@attrs.frozen(kw_only=True)
class GgufHeader:
    """Everything in a GGUF file except the tensor data.

    ``fields`` maps each metadata key to a Python value: strings decoded, numbers as ``int`` /
    ``float`` (float32 values as the shortest decimal that is the same float32), booleans as
    ``bool``, arrays as lists (nested arrays as nested lists).
    """

    path: str
    version: int
    fields: Mapping[str, object]
    tensors: tuple[GgufTensorInfo, ...]

    @property
    def source(self) -> str:
        """How error messages name this file."""
        return f"GGUF file at {self.path}"

    @property
    def architecture(self) -> str | None:
        value = self.fields.get(ARCHITECTURE_KEY)
        return value if isinstance(value, str) else None

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(tensor.name for tensor in self.tensors)

    def has_tensor(self, name: str) -> bool:
        return any(tensor.name == name for tensor in self.tensors)

    def tensor(self, name: str) -> GgufTensorInfo | None:
        return next((tensor for tensor in self.tensors if tensor.name == name), None)


def read_gguf_header(path: str | os.PathLike[str]) -> GgufHeader:
    """Read ``path``'s metadata and tensor index.

    Raises one ``ConfigError`` naming the file when it is missing, not GGUF (version 2 or 3),
    truncated (in the metadata, in the tensor index, or with tensor data past its end) or
    corrupt (unknown value or ggml types, counts its bytes cannot hold, duplicate keys or tensor
    names, a bad ``general.alignment``). The last few headers read are kept, keyed by the
    file's size and modification time (a serve reads its model's header for the memory plan
    and again to load): treat the result as read-only.
    """
    file_path = Path(path)
    source = f"GGUF file at {file_path}"
    if not file_path.is_file():
        raise ConfigError(f"{source}: no such file")
    stat = file_path.stat()
    return _read_header(str(file_path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_header(path: str, size: int, mtime_ns: int) -> GgufHeader:
    del size, mtime_ns  # part of the cache key only
    file_path = Path(path)
    source = f"GGUF file at {file_path}"
    try:
        with file_path.open("rb") as file:
            if os.fstat(file.fileno()).st_size == 0:
                raise MalformedGgufError("the file is empty")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                version, fields, tensors = _parse(data)
    except MalformedGgufError as exc:
        raise ConfigError(f"{source}: not a readable GGUF file ({exc})") from exc
    except OSError as exc:
        raise ConfigError(f"{source}: cannot be read ({exc})") from exc
    return GgufHeader(path=str(file_path), version=version, fields=fields, tensors=tensors)


def _parse(data: GgufBytes) -> tuple[int, dict[str, object], tuple[GgufTensorInfo, ...]]:
    if data[: len(_MAGIC)] != _MAGIC:
        raise MalformedGgufError("it does not start with the GGUF magic number")
    cursor, version = _cursor_after_version(data)
    num_tensors = cursor.read_u64("the tensor count")
    num_fields = cursor.read_u64("the key/value count")
    fields = _read_fields(cursor, num_fields)
    index = _read_tensor_index(cursor, num_tensors)
    data_start = _round_up(cursor.offset, _alignment(fields))
    tensors = tuple(_tensor_info(entry, data_start, cursor.size) for entry in index)
    return version, fields, tensors


def _cursor_after_version(data: GgufBytes) -> tuple[GgufCursor, int]:
    # A file written on a big-endian machine reads as version 2 or 3 with ">" only.
    for byte_order in ("<", ">"):
        cursor = GgufCursor(data, byte_order=byte_order, offset=len(_MAGIC))
        version = cursor.read_u32("the version")
        if version in SUPPORTED_VERSIONS:
            return cursor, version
    little_endian = GgufCursor(data, offset=len(_MAGIC)).read_u32("the version")
    supported = ", ".join(map(str, SUPPORTED_VERSIONS))
    raise MalformedGgufError(f"unsupported GGUF version {little_endian} (supported: {supported})")


def _read_fields(cursor: GgufCursor, num_fields: int) -> dict[str, object]:
    cursor.check_count(num_fields, _MIN_FIELD_BYTES, "the key/value count")
    fields: dict[str, object] = {}
    for index in range(num_fields):
        key = cursor.read_string(f"the key of key/value pair {index}")
        what = f"the value of {key!r}"
        value_type = cursor.read_u32(what)
        if key in fields:
            raise MalformedGgufError(f"key {key!r} appears twice")
        if key == ALIGNMENT_KEY and value_type != GgufValueType.UINT32:
            raise MalformedGgufError(f"{ALIGNMENT_KEY} has value type {value_type}, not uint32")
        fields[key] = cursor.read_value(value_type, what)
    return fields


@attrs.frozen
class _IndexEntry:
    name: str
    dims: tuple[int, ...]
    ggml_type: int
    relative_offset: int


def _read_tensor_index(cursor: GgufCursor, num_tensors: int) -> list[_IndexEntry]:
    cursor.check_count(num_tensors, _MIN_TENSOR_INFO_BYTES, "the tensor count")
    entries: list[_IndexEntry] = []
    names: set[str] = set()
    for index in range(num_tensors):
        name = cursor.read_string(f"the name of tensor {index}")
        what = f"the index entry of tensor {name!r}"
        num_dims = cursor.read_u32(what)
        dims = cursor.read_u64s(num_dims, what)
        ggml_type = cursor.read_u32(what)
        relative_offset = cursor.read_u64(what)
        if name in names:
            raise MalformedGgufError(f"tensor name {name!r} appears twice")
        names.add(name)
        entries.append(
            _IndexEntry(
                name=name,
                dims=dims,
                ggml_type=ggml_type,
                relative_offset=relative_offset,
            )
        )
    return entries


def _alignment(fields: Mapping[str, object]) -> int:
    alignment = fields.get(ALIGNMENT_KEY, _DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise MalformedGgufError(f"{ALIGNMENT_KEY} is {alignment!r}, not a power of two")
    return alignment


def _round_up(offset: int, alignment: int) -> int:
    return -(-offset // alignment) * alignment


def _tensor_info(entry: _IndexEntry, data_start: int, file_bytes: int) -> GgufTensorInfo:
    ggml_type = _ggml_types().get(entry.ggml_type)
    if ggml_type is None:
        raise MalformedGgufError(f"tensor {entry.name!r} has unknown ggml type {entry.ggml_type}")
    type_name, block_size, block_bytes = ggml_type
    # GGUF lists dims innermost first: dims[0] is the row length.
    row_length = entry.dims[0] if entry.dims else 1
    if row_length % block_size:
        raise MalformedGgufError(
            f"tensor {entry.name!r} has rows of {row_length} values, which are not whole "
            f"{type_name} blocks of {block_size}"
        )
    num_bytes = math.prod(entry.dims) // block_size * block_bytes
    data_offset = data_start + entry.relative_offset
    if data_offset + num_bytes > file_bytes:
        raise MalformedGgufError(
            f"truncated: the data of tensor {entry.name!r} ends at byte "
            f"{data_offset + num_bytes} of a {file_bytes}-byte file"
        )
    return GgufTensorInfo(
        name=entry.name,
        shape=tuple(reversed(entry.dims)),
        ggml_type=type_name,
        num_bytes=num_bytes,
        data_offset=data_offset,
    )


@functools.cache
def _ggml_types() -> dict[int, tuple[str, int, int]]:
    """``{type number: (name, values per block, bytes per block)}`` for every ggml type."""
    # gguf (and numpy) load on first use: importing metrale_config stays cheap.
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return {
        int(ggml_type): (ggml_type.name, *GGML_QUANT_SIZES[ggml_type])
        for ggml_type in GGMLQuantizationType
        if ggml_type in GGML_QUANT_SIZES
    }
