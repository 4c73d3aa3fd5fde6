"""Anthropic Messages API request bodies → the chat route's ``ChatRequest``.

A request is read and checked under Anthropic's field names (each refusal names one), then
written as the chat completion body it means and parsed by ``parse_chat_request``: the same
prompt, sampling, tool grammar and parsers as ``/v1/chat/completions``.

- ``tools`` (``name``, ``description``, ``input_schema``) → functions; ``tool_choice``
  ``auto`` → ``auto`` (the server's ``--tool-call-parser``), ``any`` → ``required`` and
  ``tool`` → the named function (both forced by the grammar), ``none`` → ``none``;
  ``disable_parallel_tool_use`` → ``parallel_tool_calls`` false (the grammar's one call under
  ``any``; under ``auto`` the parser reads what the model writes).
- ``thinking`` ``enabled`` / ``adaptive`` need the server's ``--reasoning-parser``, whose
  reasoning comes back as thinking blocks, and set the template's ``enable_thinking`` (as
  ``disabled`` clears it); ``budget_tokens`` is checked (at least 1, below ``max_tokens``)
  but not enforced: reasoning and text share ``max_tokens``.
- ``stop_sequences`` → ``stop``; ``max_tokens`` is required; ``temperature``, ``top_p`` and
  ``top_k`` are the chat route's; ``metadata.user_id`` is accepted and changes nothing.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from metrale_server.api.anthropic_content import read_messages, read_system
from metrale_server.api.fields import Fields, describe
from metrale_server.api.protocol import (
    DEFAULT_IMAGE_LIMITS,
    ChatRequest,
    check_model,
    parse_chat_request,
    read_chat_prompt,
)
from metrale_server.api.sampling import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS
from metrale_server.api.tool_fields import read_tool_request
from metrale_server.engine.client import EngineClient
from metrale_server.image_limits import ImageLimits

TOOL_CHOICES = ("auto", "any", "tool", "none")
THINKING_TYPES = ("enabled", "adaptive", "disabled")
# The chat route's rule for function names (OpenAI's); Anthropic's is the same but for length.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# count_tokens counts a conversation longer than one context, as /tokenize does.
COUNT_CONTEXTS = 16


@attrs.frozen(kw_only=True)
class Conversation:
    """The chat body's prompt fields; ``tool_choice`` and ``thinking`` in Anthropic's terms
    (``thinking`` is ``None`` when not given)."""

    body: dict[str, Any]
    tool_choice: str
    thinking: str | None


def parse_messages_request(
    body: dict[str, Any],
    engine: EngineClient,
    served_model_name: str,
    *,
    tool_call_parser: str | None,
    reasoning_parser: str | None,
    image_limits: ImageLimits = DEFAULT_IMAGE_LIMITS,
) -> ChatRequest:
    """``POST /v1/messages``; the server's parsers decide what ``auto`` tools and thinking
    may be asked for."""
    fields = Fields(body)
    max_tokens = fields.raw("max_tokens")
    if max_tokens is None:
        fields.fail("max_tokens", "is required")
    conversation = _read_conversation(fields, max_tokens=max_tokens)
    chat = dict(conversation.body)
    chat["max_tokens"] = max_tokens
    chat["stream"] = fields.read_bool("stream", False)
    stop = _read_stop_sequences(fields)
    if stop:
        chat["stop"] = stop
    for name in ("temperature", "top_p", "top_k"):
        if fields.has(name):
            chat[name] = fields.raw(name)
    metadata = fields.read_object("metadata")
    metadata.read_optional_str("user_id")
    metadata.refuse_unread()
    fields.refuse_unread()
    if conversation.tool_choice == "auto" and "tools" in chat and tool_call_parser is None:
        fields.fail(
            "tool_choice",
            '"auto" (the default when tools are given) needs the server started with '
            '--tool-call-parser; use {"type": "any"}, {"type": "tool", "name": ...} or '
            '{"type": "none"} otherwise',
        )
    if conversation.thinking in ("enabled", "adaptive") and reasoning_parser is None:
        fields.fail(
            "thinking",
            "needs the server started with --reasoning-parser, which reads the model's "
            "reasoning into thinking blocks",
        )
    return parse_chat_request(
        chat,
        engine,
        served_model_name,
        tool_call_parser=tool_call_parser,
        image_limits=image_limits,
    )


def count_message_tokens(
    body: dict[str, Any],
    engine: EngineClient,
    served_model_name: str,
    *,
    image_limits: ImageLimits = DEFAULT_IMAGE_LIMITS,
) -> int:
    """``POST /v1/messages/count_tokens``: the prompt tokens ``/v1/messages`` would report as
    ``usage.input_tokens`` for the same conversation."""
    fields = Fields(body)
    conversation = _read_conversation(fields, max_tokens=None)
    fields.refuse_unread()
    chat = Fields(conversation.body)
    check_model(chat, served_model_name)
    tools = read_tool_request(chat, has_parser=True)  # how calls are read does not matter
    prompt = read_chat_prompt(
        engine, chat, tools=tools.template_tools, limits=image_limits, contexts=COUNT_CONTEXTS
    )
    return len(prompt.token_ids)


def _read_conversation(fields: Fields, *, max_tokens: object) -> Conversation:
    """The fields both routes take: model, system, messages, tools, tool_choice, thinking."""
    chat: dict[str, Any] = {}
    if fields.has("model"):
        chat["model"] = fields.raw("model")
    system = read_system(fields)
    messages = read_messages(fields)
    chat["messages"] = messages if system is None else [system, *messages]
    tools = _read_tools(fields)
    if tools:
        chat["tools"] = tools
    tool_choice = _read_tool_choice(fields, {tool["function"]["name"] for tool in tools}, chat)
    thinking = _read_thinking(fields, max_tokens)
    if thinking is not None:
        chat["chat_template_kwargs"] = {"enable_thinking": thinking != "disabled"}
    return Conversation(body=chat, tool_choice=tool_choice, thinking=thinking)


def _read_tools(fields: Fields) -> list[dict[str, Any]]:
    tools = []
    for tool in fields.read_object_list("tools"):
        kind = tool.read_optional_str("type")
        if kind not in (None, "custom"):
            tool.fail(
                "type",
                f"only custom tools (name, description, input_schema) are supported, got {kind!r}",
            )
        name = tool.read_optional_str("name")
        if name is None or not _TOOL_NAME.fullmatch(name):
            tool.fail("name", "is required: 1 to 64 letters, digits, underscores or dashes")
        description = tool.read_optional_str("description")
        schema = tool.raw("input_schema")
        if not isinstance(schema, dict):
            tool.fail("input_schema", f"is required: a JSON schema object, got {describe(schema)}")
        if schema.get("type") != "object":
            tool.fail("input_schema", 'must be a schema of "type": "object"')
        tool.read_object("cache_control")
        tool.refuse_unread()
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if description is not None:
            function["description"] = description
        tools.append({"type": "function", "function": function})
    return tools


def _read_tool_choice(fields: Fields, names: set[str], chat: dict[str, Any]) -> str:
    """The choice's type (``auto`` when absent), written into ``chat`` as the chat route's."""
    choice = fields.read_object("tool_choice")
    if not choice.body:
        return "auto"
    kind = choice.read_optional_str("type")
    if kind not in TOOL_CHOICES:
        choice.fail("type", f"must be one of {', '.join(TOOL_CHOICES)}, got {kind!r}")
    if kind != "none" and choice.read_bool("disable_parallel_tool_use", False):
        chat["parallel_tool_calls"] = False
    if kind in ("any", "tool") and not names:
        choice.fail("type", f"{kind!r} needs tools")
    if kind == "tool":
        name = choice.read_optional_str("name")
        if name is None:
            choice.fail("name", "is required when type is tool")
        if name not in names:
            choice.fail("name", f"{name!r} is not one of the request's tools")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    choice.refuse_unread()
    return kind


def _read_thinking(fields: Fields, max_tokens: object) -> str | None:
    thinking = fields.read_object("thinking")
    if not thinking.body:
        return None
    kind = thinking.read_optional_str("type")
    if kind not in THINKING_TYPES:
        thinking.fail("type", f"must be one of {', '.join(THINKING_TYPES)}, got {kind!r}")
    if kind == "enabled":
        budget = thinking.read_optional_int("budget_tokens", minimum=1)
        if budget is None:
            thinking.fail("budget_tokens", "is required when type is enabled")
        if isinstance(max_tokens, int) and budget >= max_tokens:
            thinking.fail("budget_tokens", f"must be less than max_tokens ({max_tokens})")
    if kind != "disabled" and thinking.read_optional_str("display") not in (None, "summarized"):
        thinking.fail("display", 'only "summarized" is supported')
    thinking.refuse_unread()
    return kind


def _read_stop_sequences(fields: Fields) -> list[str]:
    stops = fields.read_list("stop_sequences") or []
    if not all(isinstance(stop, str) and stop for stop in stops):
        fields.fail("stop_sequences", "expected an array of non-empty strings")
    if len(stops) > MAX_STOP_STRINGS:
        fields.fail("stop_sequences", f"at most {MAX_STOP_STRINGS} sequences, got {len(stops)}")
    if any(len(stop) > MAX_STOP_STRING_CHARS for stop in stops):
        fields.fail(
            "stop_sequences", f"a stop sequence is at most {MAX_STOP_STRING_CHARS} characters"
        )
    return stops
