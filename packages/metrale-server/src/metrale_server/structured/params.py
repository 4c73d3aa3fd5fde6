"""``StructuredOutputsParams``: the grammar one request's outputs must follow (vLLM's names)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import attrs

KINDS = ("json", "regex", "choice", "grammar", "json_object")


def _schema_text(schema: str | dict[str, Any] | None) -> str | None:
    """A schema as JSON text, so it can be a cache key. Key order is kept: the order of a
    schema's properties is the order the output writes them in."""
    if schema is None or isinstance(schema, str):
        return schema
    return json.dumps(schema, ensure_ascii=False)


def _choices(values: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


@attrs.frozen(kw_only=True)
class StructuredOutputsParams:
    """Exactly one of: ``json`` (a JSON schema, as a dict or its JSON text), ``regex``,
    ``choice`` (the output is one of these strings), ``grammar`` (Lark, or GBNF as llama.cpp and
    vLLM's xgrammar users write it) or ``json_object`` (any JSON object).

    Hashable: equal constraints are one entry of the compiled-grammar cache.
    """

    json: str | None = attrs.field(default=None, converter=_schema_text)
    regex: str | None = None
    choice: tuple[str, ...] | None = attrs.field(default=None, converter=_choices)
    grammar: str | None = None
    json_object: bool = False

    def __attrs_post_init__(self) -> None:
        set_kinds = [kind for kind in KINDS if getattr(self, kind) not in (None, False)]
        if len(set_kinds) != 1:
            raise ValueError(
                f"structured_outputs: set exactly one of {', '.join(KINDS)}, "
                f"got {', '.join(set_kinds) or 'none'}"
            )
        if self.choice is not None and not all(isinstance(c, str) and c for c in self.choice):
            raise ValueError("structured_outputs: choices must be non-empty strings")

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if getattr(self, kind) not in (None, False))
