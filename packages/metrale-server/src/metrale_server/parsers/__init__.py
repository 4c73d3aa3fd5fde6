"""Output parsers: tool calls in each model family's format, and reasoning blocks.

``make_tool_call_parser(name)`` / ``make_reasoning_parser(name)`` return a parser for one
output: ``parse(text)`` reads a whole output, ``feed(delta, is_final=...)`` a streamed one, and
the streamed pieces concatenate to what ``parse`` returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from metrale_server.parsers.glm45 import Glm45ToolCallParser
from metrale_server.parsers.hermes import HermesToolCallParser
from metrale_server.parsers.llama3_json import Llama3JsonToolCallParser
from metrale_server.parsers.mistral import MistralToolCallParser
from metrale_server.parsers.reasoning import ThinkReasoningParser
from metrale_server.parsers.required_array import RequiredArrayParser
from metrale_server.parsers.types import (
    ParsedToolCalls,
    ReasoningSplit,
    StreamDelta,
    ToolCall,
    ToolCallDelta,
)


class ToolCallParser(Protocol):
    def parse(self, text: str) -> ParsedToolCalls: ...

    def feed(self, delta: str, *, is_final: bool) -> StreamDelta: ...


class ReasoningParser(Protocol):
    def parse(self, text: str) -> ReasoningSplit: ...

    def feed(self, delta: str, *, is_final: bool) -> ReasoningSplit: ...


# vLLM's names for --tool-call-parser.
TOOL_CALL_PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesToolCallParser,
    "llama3_json": Llama3JsonToolCallParser,
    "mistral": MistralToolCallParser,
    "glm45": Glm45ToolCallParser,
}
TOOL_CALL_PARSER_NAMES = tuple(TOOL_CALL_PARSERS)
# Not a model format: what the grammar of tool_choice "required" makes the model write.
REQUIRED_CALLS_PARSER = "openai_required"
REASONING_PARSERS: dict[str, Callable[[], ReasoningParser]] = {
    "deepseek_r1": lambda: ThinkReasoningParser(is_open_tag_required=False),
    "qwen3": lambda: ThinkReasoningParser(is_open_tag_required=True),
}
REASONING_PARSER_NAMES = tuple(REASONING_PARSERS)


def make_tool_call_parser(name: str) -> ToolCallParser:
    if name == REQUIRED_CALLS_PARSER:
        return RequiredArrayParser()
    if name not in TOOL_CALL_PARSERS:
        raise ValueError(
            f"unknown tool-call parser {name!r}; choose one of {', '.join(TOOL_CALL_PARSERS)}"
        )
    return TOOL_CALL_PARSERS[name]()


def make_reasoning_parser(name: str) -> ReasoningParser:
    if name not in REASONING_PARSERS:
        raise ValueError(
            f"unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSERS)}"
        )
    return REASONING_PARSERS[name]()


__all__ = [
    "REASONING_PARSER_NAMES",
    "REQUIRED_CALLS_PARSER",
    "TOOL_CALL_PARSER_NAMES",
    "ParsedToolCalls",
    "ReasoningParser",
    "ReasoningSplit",
    "StreamDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "make_reasoning_parser",
    "make_tool_call_parser",
]
