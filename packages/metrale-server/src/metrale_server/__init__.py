"""Metrale inference server: the engine (``LLM``, ``AsyncEngine``), HTTP API and CLI."""

from metrale_server.async_engine import AsyncEngine, EngineDeadError
from metrale_server.engine import Engine, RequestError
from metrale_server.engine_args import EngineArgs
from metrale_server.engine_stats import EngineStats
from metrale_server.llm import LLM
from metrale_server.outputs import CompletionOutput, RequestOutput, TokenLogprob
from metrale_server.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "Engine",
    "EngineArgs",
    "EngineDeadError",
    "EngineStats",
    "RequestError",
    "RequestOutput",
    "SamplingParams",
    "TokenLogprob",
]
