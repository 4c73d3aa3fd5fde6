"""OpenAI Responses API request bodies → the chat route's ``ChatRequest``.

A request is read and checked under the Responses API's field names (each refusal names one),
then written as the chat completion body it means and parsed by ``parse_chat_request``: the
same prompt, sampling, tool grammar and parsers as ``/v1/chat/completions``.

- ``input`` (a string: one user message; or items) and ``instructions`` (a system message
  first) → ``messages``. Items: messages (``user``, ``system``, ``developer``, ``assistant``;
  a string or ``input_text`` / ``input_image`` / ``output_text`` parts), ``function_call`` (an
  assistant turn's ``tool_calls``), ``function_call_output`` (a tool message) and
  ``reasoning`` (the assistant turn's reasoning). Consecutive assistant items make one
  assistant turn.
- ``previous_response_id`` puts the stored response's conversation (its input items and output
  items) before ``input``; its ``instructions`` are not carried over, as OpenAI's are not.
- ``tools`` (``function``: name, description, parameters, strict) and ``tool_choice``
  (``auto``, ``none``, ``required``, ``{"type": "function", "name"}``) → the chat route's.
- ``text.format`` (``text``, ``json_object``, ``json_schema``) → ``response_format``.
- ``max_output_tokens`` → ``max_tokens``; ``temperature``, ``top_p``, ``parallel_tool_calls``
  are the chat route's; ``reasoning``, ``metadata``, ``user``, ``store`` are accepted (the
  reasoning parser, when the server has one, decides what reasoning comes back).
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from metrale_server.api.errors import ApiError
from metrale_server.api.fields import Fields, describe
from metrale_server.api.protocol import DEFAULT_IMAGE_LIMITS, ChatRequest, parse_chat_request
from metrale_server.api.responses_store import ResponseStore
from metrale_server.engine.client import EngineClient
from metrale_server.image_limits import ImageLimits

ROLES = ("user", "system", "developer", "assistant")
TOOL_CHOICES = ("auto", "none", "required")
FORMAT_TYPES = ("text", "json_object", "json_schema")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# The chat route's field names → the Responses API's, for the refusals it makes.
_RENAMED_PARAMS = (
    ("response_format.json_schema.", "text.format."),
    ("response_format", "text.format"),
    ("max_tokens", "max_output_tokens"),
    ("messages", "input"),
)


@attrs.frozen(kw_only=True)
class ResponsesRequest:
    """The chat request, the conversation's input items (for the store) and the request fields
    a response echoes."""

    chat: ChatRequest
    input_items: tuple[dict[str, Any], ...]
    echo: dict[str, Any]
    store: bool


def parse_responses_request(
    body: dict[str, Any],
    engine: EngineClient,
    served_model_name: str,
    *,
    store: ResponseStore,
    tool_call_parser: str | None,
    image_limits: ImageLimits = DEFAULT_IMAGE_LIMITS,
) -> ResponsesRequest:
    """``POST /v1/responses``; a refusal of the chat route names the Responses API's field."""
    fields = Fields(body)
    chat: dict[str, Any] = {}
    if fields.has("model"):
        chat["model"] = fields.raw("model")
    previous_id = fields.read_optional_str("previous_response_id")
    earlier: tuple[dict[str, Any], ...] = ()
    if previous_id is not None:
        previous = store.get(previous_id)
        if previous is None:
            fields.fail("previous_response_id", f"no stored response has the id {previous_id!r}")
        earlier = (*previous.input_items, *previous.output_items)
    items = _read_input(fields)
    instructions = fields.read_optional_str("instructions")
    messages = items_to_messages(Fields({"input": [*earlier, *items]}), "input", len(earlier))
    if instructions is not None:
        messages.insert(0, {"role": "system", "content": instructions})
    chat["messages"] = messages
    tools = _read_tools(fields)
    if tools:
        chat["tools"] = [_chat_tool(tool) for tool in tools]
    tool_choice = _read_tool_choice(fields, {tool["name"] for tool in tools})
    if tool_choice is not None:
        chat["tool_choice"] = tool_choice
    if fields.has("parallel_tool_calls"):
        chat["parallel_tool_calls"] = fields.read_bool("parallel_tool_calls", True)
    text = _read_text(fields)
    if text["format"]["type"] != "text":
        chat["response_format"] = _response_format(text["format"])
    for name in ("temperature", "top_p"):
        if fields.has(name):
            chat[name] = fields.raw(name)
    if fields.has("max_output_tokens"):
        chat["max_tokens"] = fields.raw("max_output_tokens")
    chat["stream"] = fields.read_bool("stream", False)
    is_stored = fields.read_bool("store", True)
    reasoning = _read_reasoning(fields)
    metadata = _read_metadata(fields)
    user = fields.read_optional_str("user")
    truncation = fields.read_optional_str("truncation")
    if truncation not in (None, "disabled"):
        fields.fail("truncation", 'only "disabled" is supported')
    if fields.read_list("include"):
        fields.fail("include", "is not supported by this server")
    fields.refuse_unread()
    if tool_choice in (None, "auto") and tools and tool_call_parser is None:
        fields.fail(
            "tool_choice",
            '"auto" (the default when tools are given) needs the server started with '
            '--tool-call-parser; use "required", {"type": "function", "name": ...} or "none" '
            "otherwise",
        )
    try:
        parsed = parse_chat_request(
            chat,
            engine,
            served_model_name,
            tool_call_parser=tool_call_parser,
            image_limits=image_limits,
        )
    except ApiError as error:
        raise renamed(error) from error
    echo = {
        "instructions": instructions,
        "max_output_tokens": fields.raw("max_output_tokens"),
        "metadata": metadata,
        "parallel_tool_calls": fields.read_bool("parallel_tool_calls", True),
        "previous_response_id": previous_id,
        "reasoning": reasoning,
        "store": is_stored,
        "temperature": fields.read_float("temperature", 1.0),
        "text": text,
        "tool_choice": _echoed_choice(tool_choice),
        "tools": tools,
        "top_p": fields.read_float("top_p", 1.0),
        "truncation": "disabled",
        "user": user,
    }
    return ResponsesRequest(chat=parsed, input_items=(*earlier, *items), echo=echo, store=is_stored)


def renamed(error: ApiError) -> ApiError:
    """``error`` naming the Responses API's field where it names the chat route's."""
    param = error.param
    if param is None:
        return error
    for chat_name, name in _RENAMED_PARAMS:
        if param.startswith(chat_name):
            new_param = name + param[len(chat_name) :]
            message = error.message
            if message.startswith(param):
                message = new_param + message[len(param) :]
            return ApiError(
                error.status,
                message,
                param=new_param,
                code=error.code,
                type=error.type,
                headers=error.headers,
            )
    return error


def _read_input(fields: Fields) -> list[dict[str, Any]]:
    """``input`` as a list of items (a string is one user message)."""
    value = fields.raw("input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        fields.fail("input", f"is required: a string or an array of items, got {describe(value)}")
    if not value:
        fields.fail("input", "must not be empty")
    return list(value)


def items_to_messages(fields: Fields, name: str, num_checked: int) -> list[dict[str, Any]]:
    """The items of ``fields[name]`` as chat messages; a refusal names the item at fault
    (counted from the request's own ``input``: the first ``num_checked`` came from the
    store)."""
    messages: list[dict[str, Any]] = []
    call_ids: set[str] = set()
    is_open_turn = False  # whether the last message is an assistant turn items may extend
    for index, value in enumerate(fields.read_list(name) or []):
        param = f"{name}[{index - num_checked}]"
        if not isinstance(value, dict):
            fields.fail(param, f"expected an object, got {describe(value)}")
        item = Fields(value, f"{param}.")
        kind = item.read_optional_str("type") or "message"
        item.read_optional_str("id")
        item.read_optional_str("status")
        if kind == "message":
            role = item.raw("role")
            if role not in ROLES:
                item.fail("role", f"must be one of {', '.join(ROLES)}, got {role!r}")
            parts = _read_parts(item, role)
            item.refuse_unread()
            if role != "assistant":
                chat_role = "system" if role == "developer" else role
                messages.append({"role": chat_role, "content": parts})
                is_open_turn = False
                continue
            turn = _assistant_turn(messages, is_open_turn)
            turn["content"] = [*(turn["content"] or []), *parts] or ""
        elif kind == "function_call":
            call_id = _required_str(item, "call_id")
            name_ = _required_str(item, "name")
            arguments = _required_str(item, "arguments")
            item.refuse_unread()
            call_ids.add(call_id)
            turn = _assistant_turn(messages, is_open_turn)
            function = {"name": name_, "arguments": arguments}
            call = {"id": call_id, "type": "function", "function": function}
            turn.setdefault("tool_calls", []).append(call)
        elif kind == "reasoning":
            texts = _reasoning_texts(item)
            item.read_optional_str("encrypted_content")
            item.refuse_unread()
            turn = _assistant_turn(messages, is_open_turn)
            if texts:
                earlier = turn.get("reasoning_content")
                turn["reasoning_content"] = "\n".join([*([earlier] if earlier else []), *texts])
        elif kind == "function_call_output":
            call_id = _required_str(item, "call_id")
            if call_id not in call_ids:
                item.fail("call_id", f"{call_id!r} is not the call_id of an earlier function_call")
            output = _read_output(item)
            item.refuse_unread()
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
            is_open_turn = False
            continue
        else:
            item.fail(
                "type",
                "must be one of message, function_call, function_call_output, reasoning, "
                f"got {kind!r}",
            )
        is_open_turn = True
    return messages


def _assistant_turn(messages: list[dict[str, Any]], is_open: bool) -> dict[str, Any]:
    if not (is_open and messages and messages[-1]["role"] == "assistant"):
        messages.append({"role": "assistant", "content": ""})
    return messages[-1]


def _required_str(item: Fields, name: str) -> str:
    value = item.read_optional_str(name)
    if value is None:
        item.fail(name, "is required")
    return value


def _read_parts(item: Fields, role: str) -> list[dict[str, Any]]:
    content = item.raw("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        item.fail("content", f"expected a string or an array of parts, got {describe(content)}")
    allowed = ("output_text", "refusal") if role == "assistant" else ("input_text", "input_image")
    parts = []
    for index, value in enumerate(content):
        if not isinstance(value, dict):
            item.fail(f"content[{index}]", f"expected an object, got {describe(value)}")
        part = Fields(value, item.param(f"content[{index}]."))
        kind = part.read_optional_str("type")
        if kind not in allowed:
            part.fail("type", f"{role} messages may hold {', '.join(allowed)} parts, got {kind!r}")
        if kind == "input_image":
            parts.append(_image_part(part))
            continue
        text = part.read_optional_str("refusal" if kind == "refusal" else "text")
        if text is None:
            part.fail("text", "is required")
        if kind == "output_text":
            part.read_list("annotations")
            part.read_list("logprobs")
        part.refuse_unread()
        parts.append({"type": "text", "text": text})
    return parts


def _image_part(part: Fields) -> dict[str, Any]:
    """An ``input_image`` part (``image_url``: a data URL or an http(s) URL) as the chat
    route's ``image_url`` part, which reads, limits and prepares it."""
    url = part.read_optional_str("image_url")
    if url is None:
        part.fail("image_url", "is required (a data URL or an http(s) URL; file_id is not taken)")
    detail = part.read_optional_str("detail")
    part.refuse_unread()
    image_url = {"url": url} if detail is None else {"url": url, "detail": detail}
    return {"type": "image_url", "image_url": image_url}


def _reasoning_texts(item: Fields) -> list[str]:
    """The reasoning's texts: its content, or its summary when it has none (a summary only
    stands in for the reasoning)."""
    texts: dict[str, list[str]] = {}
    for name in ("content", "summary"):
        texts[name] = []
        for index, value in enumerate(item.read_list(name) or []):
            if not isinstance(value, dict) or not isinstance(value.get("text"), str):
                item.fail(f"{name}[{index}]", "expected an object with a text")
            texts[name].append(value["text"])
    return texts["content"] or texts["summary"]


def _read_output(item: Fields) -> str | list[dict[str, str]]:
    output = item.raw("output")
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        item.fail("output", f"is required: a string or input_text parts, got {describe(output)}")
    parts = []
    for index, value in enumerate(output):
        if not (isinstance(value, dict) and value.get("type") == "input_text"):
            item.fail(f"output[{index}]", "expected an input_text part")
        if not isinstance(value.get("text"), str):
            item.fail(f"output[{index}]", "expected an input_text part with a text")
        parts.append({"type": "text", "text": value["text"]})
    return parts


def _read_tools(fields: Fields) -> list[dict[str, Any]]:
    """The function tools as the response echoes them."""
    tools = []
    for tool in fields.read_object_list("tools"):
        kind = tool.read_optional_str("type")
        if kind != "function":
            tool.fail("type", f'only "function" tools are supported, got {kind!r}')
        name = tool.read_optional_str("name")
        if name is None or not _TOOL_NAME.fullmatch(name):
            tool.fail("name", "is required: 1 to 64 letters, digits, underscores or dashes")
        parameters = tool.raw("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            tool.fail("parameters", f"expected a JSON schema object, got {describe(parameters)}")
        description = tool.read_optional_str("description")
        strict = tool.raw("strict")
        if strict is not None:
            strict = tool.read_bool("strict", True)
        tool.refuse_unread()
        tools.append(
            {
                "type": "function",
                "name": name,
                "description": description,
                "parameters": parameters,
                "strict": strict,
            }
        )
    return tools


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool["name"]}
    if tool["description"] is not None:
        function["description"] = tool["description"]
    if tool["parameters"] is not None:
        function["parameters"] = tool["parameters"]
    return {"type": "function", "function": function}


def _read_tool_choice(fields: Fields, names: set[str]) -> str | dict[str, Any] | None:
    """The chat route's ``tool_choice`` (``None`` when absent)."""
    value = fields.raw("tool_choice")
    if value is None:
        return None
    if isinstance(value, str):
        if value not in TOOL_CHOICES:
            fields.fail("tool_choice", f"must be one of {', '.join(TOOL_CHOICES)} or a function")
        if value == "required" and not names:
            fields.fail("tool_choice", '"required" needs tools')
        return value
    if not isinstance(value, dict):
        fields.fail("tool_choice", f"expected a string or an object, got {describe(value)}")
    choice = Fields(value, "tool_choice.")
    if choice.read_optional_str("type") != "function":
        choice.fail("type", 'must be "function" (other tool choices are not supported)')
    name = choice.read_optional_str("name")
    choice.refuse_unread()
    if name is None:
        choice.fail("name", "is required")
    if name not in names:
        choice.fail("name", f"{name!r} is not one of the request's tools")
    return {"type": "function", "function": {"name": name}}


def _echoed_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any]:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        return choice
    return {"type": "function", "name": choice["function"]["name"]}


def _read_text(fields: Fields) -> dict[str, Any]:
    """``text`` as the response echoes it: its ``format`` (``text`` when absent)."""
    text = fields.read_object("text")
    text_format = text.read_object("format")
    verbosity = text.read_optional_str("verbosity")
    if verbosity not in (None, "medium"):
        text.fail("verbosity", 'only "medium" is supported')
    text.refuse_unread()
    kind = text_format.read_optional_str("type") or "text"
    if kind not in FORMAT_TYPES:
        text_format.fail("type", f"must be one of {', '.join(FORMAT_TYPES)}, got {kind!r}")
    if kind != "json_schema":
        text_format.refuse_unread()
        return {"format": {"type": kind}}
    name = text_format.read_optional_str("name")
    if name is None or not _TOOL_NAME.fullmatch(name):
        text_format.fail("name", "is required: 1 to 64 letters, digits, underscores or dashes")
    schema = text_format.raw("schema")
    if not isinstance(schema, dict):
        text_format.fail("schema", f"is required: a JSON schema object, got {describe(schema)}")
    description = text_format.read_optional_str("description")
    strict = text_format.read_bool("strict", False)
    text_format.refuse_unread()
    echoed = {"type": "json_schema", "name": name, "schema": schema, "strict": strict}
    if description is not None:
        echoed["description"] = description
    return {"format": echoed}


def _response_format(text_format: dict[str, Any]) -> dict[str, Any]:
    if text_format["type"] == "json_object":
        return {"type": "json_object"}
    json_schema = {key: value for key, value in text_format.items() if key != "type"}
    return {"type": "json_schema", "json_schema": json_schema}


def _read_reasoning(fields: Fields) -> dict[str, Any] | None:
    reasoning = fields.read_object("reasoning")
    if not reasoning.body:
        return None
    effort = reasoning.read_optional_str("effort")
    summary = reasoning.read_optional_str("summary")
    reasoning.read_optional_str("generate_summary")
    reasoning.refuse_unread()
    return {"effort": effort, "summary": summary}


def _read_metadata(fields: Fields) -> dict[str, str]:
    metadata = fields.read_object("metadata")
    for key, value in metadata.body.items():
        if not isinstance(value, str):
            metadata.fail(key, f"expected a string, got {describe(value)}")
    if len(metadata.body) > 16:
        fields.fail("metadata", "at most 16 keys")
    return dict(metadata.body)
