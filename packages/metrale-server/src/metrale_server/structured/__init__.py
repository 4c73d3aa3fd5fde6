"""Structured outputs: constraints, their grammars, per-output matchers and token bitmasks.

The names below are imported on first use (PEP 562): ``SamplingParams`` needs only
``StructuredOutputsParams``, and ``met --help`` should not wait for llguidance and torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metrale_server.structured.bitmask import (
        allocate_bitmask,
        apply_bitmask_,
        bitmask_words,
        unpack_bitmask,
    )
    from metrale_server.structured.compiler import (
        GRAMMAR_BACKEND,
        GrammarCompiler,
        GrammarError,
    )
    from metrale_server.structured.matcher import (
        CompiledGrammar,
        GrammarMatcher,
        fill_bitmasks,
    )
    from metrale_server.structured.params import StructuredOutputsParams

_HOMES = {
    "GRAMMAR_BACKEND": "metrale_server.structured.compiler",
    "CompiledGrammar": "metrale_server.structured.matcher",
    "GrammarCompiler": "metrale_server.structured.compiler",
    "GrammarError": "metrale_server.structured.compiler",
    "GrammarMatcher": "metrale_server.structured.matcher",
    "StructuredOutputsParams": "metrale_server.structured.params",
    "allocate_bitmask": "metrale_server.structured.bitmask",
    "apply_bitmask_": "metrale_server.structured.bitmask",
    "bitmask_words": "metrale_server.structured.bitmask",
    "fill_bitmasks": "metrale_server.structured.matcher",
    "unpack_bitmask": "metrale_server.structured.bitmask",
}

__all__ = [
    "GRAMMAR_BACKEND",
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarMatcher",
    "StructuredOutputsParams",
    "allocate_bitmask",
    "apply_bitmask_",
    "bitmask_words",
    "fill_bitmasks",
    "unpack_bitmask",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'metrale_server.structured' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
