"""Metrale inference server: the engine (``LLM``, ``build_engine``, ``AsyncEngine``), API, CLI.

The names below are imported on first use (PEP 562), so ``met --help`` and the start of
``met serve`` (which binds its socket before anything loads) do not wait for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metrale_server.args import EngineArgs
    from metrale_server.engine.async_engine import AsyncEngine, EngineDeadError
    from metrale_server.engine.bootstrap import build_engine
    from metrale_server.engine.core import EngineCore, RequestError
    from metrale_server.engine.engine import Engine
    from metrale_server.engine.llm import LLM
    from metrale_server.engine.stats import EngineStats
    from metrale_server.output.outputs import CompletionOutput, RequestOutput, TokenLogprob
    from metrale_server.output.processor import RequestOutputKind
    from metrale_server.sampling.params import SamplingParams
    from metrale_server.structured.params import StructuredOutputsParams

_HOMES = {
    "LLM": "metrale_server.engine.llm",
    "AsyncEngine": "metrale_server.engine.async_engine",
    "CompletionOutput": "metrale_server.output.outputs",
    "Engine": "metrale_server.engine.engine",
    "EngineArgs": "metrale_server.args",
    "EngineCore": "metrale_server.engine.core",
    "EngineDeadError": "metrale_server.engine.async_engine",
    "EngineStats": "metrale_server.engine.stats",
    "RequestError": "metrale_server.engine.core",
    "RequestOutput": "metrale_server.output.outputs",
    "RequestOutputKind": "metrale_server.output.processor",
    "SamplingParams": "metrale_server.sampling.params",
    "StructuredOutputsParams": "metrale_server.structured.params",
    "TokenLogprob": "metrale_server.output.outputs",
    "build_engine": "metrale_server.engine.bootstrap",
}

__all__ = [
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "Engine",
    "EngineArgs",
    "EngineCore",
    "EngineDeadError",
    "EngineStats",
    "RequestError",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "StructuredOutputsParams",
    "TokenLogprob",
    "build_engine",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'metrale_server' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
