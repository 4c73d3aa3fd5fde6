"""``StructuredOutputsParams``: the grammar one request's outputs must follow (vLLM's names)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import orjson

KINDS = ("json", "regex", "choice", "grammar", "json_object")


def _schema_text(schema: str | dict[str, Any] | None) -> str | None:
    """A schema as JSON text, so the params hash and can key the compiled-grammar cache.

    Keys keep their order (no ``sort_keys``): the order of a schema's ``properties`` is the
    order the output writes them in, so sorting would change the outputs. The same schema
    written in another key order is therefore another cache entry, which costs one compile.
    Compact JSON (no spaces), written by orjson: ~10x shorter under the interpreter
    lock than ``json.dumps`` (a 300 KB schema: 0.5 ms).
    """
    if schema is None or isinstance(schema, str):
        return schema
    return orjson.dumps(schema).decode()


def _choices(values: Iterable[str] | None) -> tuple[str, ...] | None:
    if values is None:
        return None
    if isinstance(values, str):
        raise ValueError("structured_outputs: choice must be a list of strings, not one string")
    return tuple(values)


@attrs.frozen(kw_only=True)
class StructuredOutputsParams:
    """Exactly one of:

    * ``json``: a JSON schema, as a dict or as its JSON text (kept as text);
    * ``regex``: the whole output matches this regular expression (Rust ``regex`` syntax, which
      is Python's ``re`` without look-around or backreferences; ``\\d`` is Unicode, as in
      Python);
    * ``choice``: the output is one of these non-empty strings;
    * ``grammar``: a context-free grammar in llguidance's Lark syntax (``start: ...``), or GBNF
      as llama.cpp and vLLM's xgrammar users write it (``root ::= ...``), converted to Lark;
    * ``json_object``: any JSON object.

    ``ValueError`` unless exactly one is set. Frozen and hashable: equal constraints are one
    entry of the compiled-grammar cache.
    """

    json: str | None = attrs.field(default=None, converter=_schema_text)
    regex: str | None = None
    choice: tuple[str, ...] | None = attrs.field(default=None, converter=_choices)
    grammar: str | None = None
    json_object: bool = False

    def __attrs_post_init__(self) -> None:
        set_kinds = [kind for kind in KINDS if _is_set(getattr(self, kind))]
        if len(set_kinds) != 1:
            raise ValueError(
                f"structured_outputs: set exactly one of {', '.join(KINDS)}, "
                f"got {', '.join(set_kinds) or 'none'}"
            )
        if self.choice is not None and (
            not self.choice or not all(isinstance(c, str) and c for c in self.choice)
        ):
            raise ValueError(
                "structured_outputs: choice must be a non-empty list of non-empty strings"
            )

    @property
    def kind(self) -> str:
        """``"json"``, ``"regex"``, ``"choice"``, ``"grammar"`` or ``"json_object"``."""
        return next(kind for kind in KINDS if _is_set(getattr(self, kind)))


def _is_set(value: object) -> bool:
    # An empty choice tuple counts as set, so that it is refused as empty, not as missing.
    return value is not None and value is not False
