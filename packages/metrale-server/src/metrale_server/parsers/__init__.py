"""Output parsers: tool calls in each model family's format, and reasoning blocks.

``make_tool_call_parser(name)`` / ``make_reasoning_parser(name)`` return a parser for one
output: ``parse(text)`` reads a whole output, ``feed(delta, is_final=...)`` one arriving in
pieces, and for any split into deltas the pieces concatenate to what ``parse`` returns.

Tool calls (``hermes``, ``llama3_json``, ``mistral``, ``glm45``; ``openai_required`` for
``tool_choice: "required"``): content is the text outside the well-formed calls, whitespace
settled as ``output.Output`` states (an output without a call comes back as it is; empty or
whitespace-only content is ``None``). Text that may still be a marker is held back; a call is
announced (its name, in its first delta) only once its name is complete and its arguments have
begun, and JSON arguments then stream as the model writes them. A malformed call (broken
JSON, no name, a marker not closed at the end) never raises: its text is content. When it is
found malformed only after its name was streamed, the stream cannot take back what it sent:
that call stays behind as a streamed call with partial arguments (the content is still the
same), and the stream's later calls have indices one higher than ``parse``'s.
"""

from __future__ import annotations

from metrale_server.parsers.reasoning import ReasoningParser, ReasoningSplit
from metrale_server.parsers.registry import (
    REASONING_PARSER_NAMES,
    REASONING_PARSERS,
    REQUIRED_CALLS_PARSER,
    SPECIAL_TOKEN_FORMATS,
    TOOL_CALL_PARSER_NAMES,
    TOOL_CALL_PARSERS,
    make_reasoning_parser,
    make_tool_call_parser,
)
from metrale_server.parsers.tool_calls import (
    ParsedToolCalls,
    StreamDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
)

__all__ = [
    "REASONING_PARSERS",
    "REASONING_PARSER_NAMES",
    "REQUIRED_CALLS_PARSER",
    "SPECIAL_TOKEN_FORMATS",
    "TOOL_CALL_PARSERS",
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
