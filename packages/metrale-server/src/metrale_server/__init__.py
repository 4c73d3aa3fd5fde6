"""Metrale inference server: the engine (``LLM``, ``AsyncEngine``), HTTP API and CLI."""

from metrale_server.engine.args import EngineArgs
from metrale_server.engine.async_engine import AsyncEngine, EngineDeadError
from metrale_server.engine.core import EngineCore, RequestError
from metrale_server.engine.engine import Engine
from metrale_server.engine.llm import LLM
from metrale_server.engine.stats import EngineStats
from metrale_server.output.outputs import CompletionOutput, RequestOutput, TokenLogprob
from metrale_server.output.processor import RequestOutputKind
from metrale_server.sampling.params import SamplingParams

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
    "TokenLogprob",
]
