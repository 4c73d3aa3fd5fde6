"""Bounds-checked reads of GGUF metadata values from a file's bytes.

GGUF stores a metadata value as one of 13 types: fixed-size scalars, a string (``u64`` byte
length, then UTF-8 bytes) or an array (``u32`` item type, ``u64`` item count, then the items,
which may themselves be arrays).
"""

from __future__ import annotations

import enum
import mmap
import struct
from typing import Final, TypeAlias

GgufBytes: TypeAlias = bytes | mmap.mmap

# llama.cpp reads no nested arrays at all; the bound keeps a hostile file from exhausting the stack.
MAX_ARRAY_DEPTH: Final = 16
_MIN_STRING_BYTES: Final = 8
_MIN_ARRAY_BYTES: Final = 4 + 8


class GgufValueType(enum.IntEnum):
    """The metadata value types, numbered as in the file (``gguf.GGUFValueType``)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_SCALAR_FORMATS: Final[dict[int, str]] = {
    GgufValueType.UINT8: "B",
    GgufValueType.INT8: "b",
    GgufValueType.UINT16: "H",
    GgufValueType.INT16: "h",
    GgufValueType.UINT32: "I",
    GgufValueType.INT32: "i",
    GgufValueType.FLOAT32: "f",
    GgufValueType.BOOL: "?",
    GgufValueType.UINT64: "Q",
    GgufValueType.INT64: "q",
    GgufValueType.FLOAT64: "d",
}


class MalformedGgufError(Exception):
    """What is wrong with a file's bytes; the caller names the file."""


class GgufCursor:
    """Reads values from ``data`` starting at ``offset``, moving ``offset`` past each one.

    ``byte_order`` is ``"<"`` (the usual little-endian file) or ``">"``. Every read that would
    run past the end of ``data``, and every unknown value type, raises ``MalformedGgufError``
    with ``what`` in its message. Values come back as Python objects: ``int``, ``float``
    (float32 values as the shortest decimal that is the same float32), ``bool``, ``str`` and
    ``list`` (nested arrays as nested lists).
    """

    __slots__ = ("_scalar_structs", "_u32", "_u64", "byte_order", "data", "offset", "size")

    def __init__(self, data: GgufBytes, *, byte_order: str = "<", offset: int = 0) -> None:
        self.data = data
        self.size = len(data)
        self.offset = offset
        self.byte_order = byte_order
        self._scalar_structs = {
            value_type: struct.Struct(byte_order + code)
            for value_type, code in _SCALAR_FORMATS.items()
        }
        self._u32 = self._scalar_structs[GgufValueType.UINT32]
        self._u64 = self._scalar_structs[GgufValueType.UINT64]

    @property
    def num_bytes_left(self) -> int:
        return self.size - self.offset

    def check_count(self, count: int, min_item_bytes: int, what: str) -> None:
        """Refuse a ``count`` of items that the bytes left cannot hold even at their smallest."""
        if count * min_item_bytes > self.num_bytes_left:
            raise MalformedGgufError(
                f"{what} claims {count} items, more than the {self.num_bytes_left} bytes left "
                "can hold"
            )

    def read_u32(self, what: str) -> int:
        value: int = self._u32.unpack_from(self.data, self._take(4, what))[0]
        return value

    def read_u64(self, what: str) -> int:
        value: int = self._u64.unpack_from(self.data, self._take(8, what))[0]
        return value

    def read_u64s(self, count: int, what: str) -> tuple[int, ...]:
        start = self._take(count * 8, what)
        return struct.unpack_from(f"{self.byte_order}{count}Q", self.data, start)

    def read_string(self, what: str) -> str:
        length = self.read_u64(what)
        start = self._take(length, what)
        try:
            return self.data[start : self.offset].decode()
        except UnicodeDecodeError as exc:
            raise MalformedGgufError(f"{what} is not UTF-8 ({exc.reason})") from exc

    def read_value(self, value_type: int, what: str) -> object:
        """Read one value of ``value_type`` (a ``GgufValueType`` number from the file)."""
        if value_type == GgufValueType.STRING:
            return self.read_string(what)
        if value_type == GgufValueType.ARRAY:
            return self._read_array(what, depth=1)
        return self.read_scalars(value_type, 1, what)[0]

    def read_scalars(self, value_type: int, count: int, what: str) -> list[object]:
        """Read ``count`` scalars of ``value_type`` laid end to end."""
        code = _SCALAR_FORMATS.get(value_type)
        if code is None:
            raise MalformedGgufError(f"{what} has unknown value type {value_type}")
        item_bytes = self._scalar_structs[value_type].size
        start = self._take(count * item_bytes, what)
        if value_type == GgufValueType.FLOAT32:
            return shortest_float32s(self.data[start : self.offset], self.byte_order)
        return list(struct.unpack_from(f"{self.byte_order}{count}{code}", self.data, start))

    def _take(self, num_bytes: int, what: str) -> int:
        """Move past ``num_bytes`` and return where they start."""
        start = self.offset
        end = start + num_bytes
        if end > self.size:
            raise MalformedGgufError(_truncated(what, end, self.size))
        self.offset = end
        return start

    def _read_array(self, what: str, depth: int) -> list[object]:
        if depth > MAX_ARRAY_DEPTH:
            raise MalformedGgufError(f"{what} nests arrays deeper than {MAX_ARRAY_DEPTH}")
        item_type = self.read_u32(what)
        count = self.read_u64(what)
        if item_type == GgufValueType.STRING:
            return self._read_strings(count, what)
        if item_type == GgufValueType.ARRAY:
            self.check_count(count, _MIN_ARRAY_BYTES, what)
            return [self._read_array(what, depth + 1) for _ in range(count)]
        return self.read_scalars(item_type, count, what)

    def _read_strings(self, count: int, what: str) -> list[object]:
        # One tight loop: vocabularies hold 10^5 strings.
        self.check_count(count, _MIN_STRING_BYTES, what)
        data = self.data
        size = self.size
        offset = self.offset
        unpack_length = self._u64.unpack_from
        strings: list[object] = []
        append = strings.append
        try:
            for _ in range(count):
                start = offset + _MIN_STRING_BYTES
                if start > size:
                    raise MalformedGgufError(_truncated(what, start, size))
                offset = start + unpack_length(data, start - _MIN_STRING_BYTES)[0]
                if offset > size:
                    raise MalformedGgufError(_truncated(what, offset, size))
                append(data[start:offset].decode())
        except UnicodeDecodeError as exc:
            raise MalformedGgufError(
                f"string {len(strings)} of {what} is not UTF-8 ({exc.reason})"
            ) from exc
        self.offset = offset
        return strings


def _truncated(what: str, end: int, size: int) -> str:
    return f"truncated in {what}: it needs byte {end} of a {size}-byte file"


def shortest_float32s(raw: bytes, byte_order: str) -> list[object]:
    """Each float32 of ``raw`` as the shortest decimal that is the same float32."""
    # numpy loads on first use; its float32 repr is the shortest decimal that round-trips.
    import numpy

    values = numpy.frombuffer(raw, dtype=numpy.dtype(f"{byte_order}f4"))
    return [float(str(value)) for value in values]
