"""The parsers by name: vLLM's names for ``--tool-call-parser`` and ``--reasoning-parser``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from metrale_server.parsers.glm45 import Glm45ToolCallParser
from metrale_server.parsers.hermes import HermesToolCallParser
from metrale_server.parsers.llama3_json import Llama3JsonToolCallParser
from metrale_server.parsers.mistral import MistralToolCallParser
from metrale_server.parsers.reasoning import ReasoningParser, ThinkReasoningParser
from metrale_server.parsers.required_array import RequiredArrayParser
from metrale_server.parsers.tool_calls import ToolCallParser

TOOL_CALL_PARSERS: Mapping[str, Callable[[], ToolCallParser]] = MappingProxyType(
    {
        "hermes": HermesToolCallParser,
        "llama3_json": Llama3JsonToolCallParser,
        "mistral": MistralToolCallParser,
        "glm45": Glm45ToolCallParser,
    }
)
TOOL_CALL_PARSER_NAMES = tuple(TOOL_CALL_PARSERS)
# Formats whose markers are special tokens of their models' tokenizers ([TOOL_CALLS], [ARGS];
# GLM's <tool_call>, <arg_key>...): the output must keep special tokens for the parser to see
# them, as vLLM's parsers for these formats arrange.
SPECIAL_TOKEN_FORMATS = frozenset({"mistral", "glm45"})
# Not a model format and not a --tool-call-parser choice: what the grammar of tool_choice
# "required" makes any model write.
REQUIRED_CALLS_PARSER = "openai_required"

REASONING_PARSERS: Mapping[str, Callable[[], ReasoningParser]] = MappingProxyType(
    {
        "deepseek_r1": lambda: ThinkReasoningParser(is_open_tag_required=False),
        "qwen3": lambda: ThinkReasoningParser(is_open_tag_required=True),
    }
)
REASONING_PARSER_NAMES = tuple(REASONING_PARSERS)


def make_tool_call_parser(name: str) -> ToolCallParser:
    """A new parser for one output: one of ``TOOL_CALL_PARSERS`` or ``REQUIRED_CALLS_PARSER``;
    ``ValueError`` naming the choices for any other name."""
    if name == REQUIRED_CALLS_PARSER:
        return RequiredArrayParser()
    factory = TOOL_CALL_PARSERS.get(name)
    if factory is None:
        raise ValueError(
            f"unknown tool-call parser {name!r}; choose one of {', '.join(TOOL_CALL_PARSERS)}"
        )
    return factory()


def make_reasoning_parser(name: str) -> ReasoningParser:
    """A new parser for one output; ``ValueError`` naming the choices for an unknown name."""
    factory = REASONING_PARSERS.get(name)
    if factory is None:
        raise ValueError(
            f"unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSERS)}"
        )
    return factory()
