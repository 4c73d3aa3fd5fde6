"""The README's supported-model table, generated from the registry (never written by hand)."""

from __future__ import annotations

from metrale_model_arch.architecture import Architecture, Trait
from metrale_model_arch.registry import ARCHITECTURES

TABLE_START = "<!-- supported-models:start (generated: metrale_model_arch.supported_models) -->"
TABLE_END = "<!-- supported-models:end -->"
_COLUMNS = ("model type", *(trait.value for trait in Trait), "GGUF", "int8 / q4")


def _mark(is_set: bool) -> str:
    return "yes" if is_set else "—"


def _row(record: Architecture) -> str:
    cells = [
        f"`{record.model_type}`",
        *(_mark(trait in record.traits) for trait in Trait),
        "yes" if record.gguf_names is not None else "no GGUF",
        _mark(bool(record.int8_linears)),
    ]
    return "| " + " | ".join(cells) + " |"


def supported_model_rows() -> list[str]:
    """The table's markdown lines: header, rule, one row per runnable model type, sorted."""
    runnable = sorted(
        (record for record in ARCHITECTURES.values() if record.is_runnable),
        key=lambda record: record.model_type,
    )
    return [
        "| " + " | ".join(_COLUMNS) + " |",
        "|" + "---|" * len(_COLUMNS),
        *(_row(record) for record in runnable),
    ]


def supported_models_section() -> str:
    """The README block between (and including) its markers."""
    return "\n".join((TABLE_START, *supported_model_rows(), TABLE_END))
