"""Typed reads of one JSON object or GGUF metadata map, with errors naming the field and file."""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from metrale_config.errors import ConfigError


class _Missing(enum.Enum):
    MISSING = enum.auto()


MISSING = _Missing.MISSING

_MAX_SHOWN_CHARS = 60


def describe_value(value: object) -> str:
    """``str '576'``, ``bool True``, ``null``: the JSON value as an error message shows it."""
    if value is None:
        return "null"
    shown = repr(value)
    if len(shown) > _MAX_SHOWN_CHARS:
        shown = shown[: _MAX_SHOWN_CHARS - 3] + "..."
    return f"{type(value).__name__} {shown}"


@attrs.frozen(kw_only=True)
class FieldReader:
    """Reads typed fields of ``data``; every failure is a ``ConfigError`` starting with ``source``.

    A field that is absent takes the given default (or is reported missing when there is none);
    a field that is present must have the declared type: ``bool`` is not an integer, a string is
    not a number, and ``null`` is accepted only by the ``optional_*`` reads.
    """

    source: str
    data: Mapping[str, object]
    prefix: str = ""

    def has(self, name: str) -> bool:
        return name in self.data

    def is_set(self, name: str) -> bool:
        """True when ``name`` is present and not ``null``."""
        return self.data.get(name) is not None

    def error(self, name: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.source}: field '{self.prefix}{name}' {problem}")

    def child(self, name: str) -> FieldReader | None:
        """The nested object ``name`` (``None`` when absent or ``null``)."""
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.error(name, f"must be an object, got {describe_value(value)}")
        return FieldReader(source=self.source, data=value, prefix=f"{self.prefix}{name}.")

    def _present(self, name: str, default: object) -> object:
        if name not in self.data:
            if default is MISSING:
                raise self.error(name, "is missing")
            return default
        return self.data[name]

    def integer(self, name: str, default: int | _Missing = MISSING) -> int:
        value = self._present(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, f"must be an integer, got {describe_value(value)}")
        return value

    def positive_integer(self, name: str, default: int | _Missing = MISSING) -> int:
        value = self.integer(name, default)
        if value <= 0:
            raise self.error(name, f"must be positive, got {value}")
        return value

    def optional_integer(self, name: str, default: int | None = None) -> int | None:
        if name not in self.data:
            return default
        if self.data[name] is None:
            return None
        return self.integer(name)

    def number(self, name: str, default: float | _Missing = MISSING) -> float:
        value = self._present(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(name, f"must be a number, got {describe_value(value)}")
        return float(value)

    def optional_number(self, name: str, default: float | None = None) -> float | None:
        if name not in self.data:
            return default
        if self.data[name] is None:
            return None
        return self.number(name)

    def boolean(self, name: str, default: bool | _Missing = MISSING) -> bool:
        value = self._present(name, default)
        if not isinstance(value, bool):
            raise self.error(name, f"must be a boolean, got {describe_value(value)}")
        return value

    def string(self, name: str, default: str | _Missing = MISSING) -> str:
        value = self._present(name, default)
        if not isinstance(value, str):
            raise self.error(name, f"must be a string, got {describe_value(value)}")
        return value

    def optional_string(self, name: str, default: str | None = None) -> str | None:
        if name not in self.data:
            return default
        if self.data[name] is None:
            return None
        return self.string(name)

    def optional_integer_list(self, name: str) -> tuple[int, ...] | None:
        """A list of integers; a single integer reads as a one-element list."""
        value = self.data.get(name)
        if value is None:
            return None
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, bool) or not isinstance(item, int):
                raise self.error(
                    name, f"must be an integer or a list of integers, got {describe_value(value)}"
                )
        return tuple(items)

    def optional_string_list(self, name: str) -> tuple[str, ...] | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.error(name, f"must be a list of strings, got {describe_value(value)}")
        return tuple(value)
