"""``messages`` → what the chat template takes: roles, text, tool calls and tool results.

Roles: ``system``, ``developer`` (rendered as ``system``: chat templates of open models know no
developer role), ``user``, ``assistant`` (``content`` may be absent when it has
``tool_calls``; ``reasoning_content`` is passed on) and ``tool`` (with ``tool_call_id``). An
assistant call's ``arguments`` arrive as JSON text and reach the template as the object they
encode, as templates such as Qwen's and Llama 3's expect (text that is not a JSON object is
passed as it is).
"""

from __future__ import annotations

import json
from typing import Any

from metrale_server.api.errors import bad_request
from metrale_server.api.fields import Fields, describe
from metrale_server.api.image_parts import ImageSource, read_image_url_part

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def read_messages(fields: Fields, images: list[ImageSource] | None = None) -> list[dict[str, Any]]:
    """The messages; each ``image_url`` part reaches the template as ``{"type": "image"}``
    and its source is appended to ``images`` (``None``: the model takes no images, and an
    image part is a 400)."""
    value = fields.read_nonempty_list("messages")
    messages = []
    for index, message in enumerate(value):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad_request(f"{param}: expected an object, got {describe(message)}", param=param)
        messages.append(_read_message(Fields(message, f"{param}."), images))
    return messages


def _read_message(item: Fields, images: list[ImageSource] | None) -> dict[str, Any]:
    role = item.raw("role")
    if role not in CHAT_ROLES:
        item.fail("role", f"must be one of {', '.join(CHAT_ROLES)}, got {role!r}")
    content = item.raw("content")
    tool_calls = _read_tool_calls(item) if role == "assistant" else None
    if content is None and role == "assistant":
        content = ""
    parsed: dict[str, Any] = {
        "role": "system" if role == "developer" else role,
        "content": _read_content(item, content, images if role == "user" else None),
    }
    name = item.read_optional_str("name")
    if name is not None:
        parsed["name"] = name
    if tool_calls:
        parsed["tool_calls"] = tool_calls
    if role == "assistant":
        reasoning = item.read_optional_str("reasoning_content")
        if reasoning is not None:
            parsed["reasoning_content"] = reasoning
    if role == "tool":
        tool_call_id = item.read_optional_str("tool_call_id")
        if tool_call_id is None:
            item.fail("tool_call_id", "is required in a tool message")
        parsed["tool_call_id"] = tool_call_id
    item.refuse_unread()
    return parsed


def _read_tool_calls(item: Fields) -> list[dict[str, Any]]:
    calls = []
    for call in item.read_object_list("tool_calls"):
        call_id = call.read_optional_str("id")
        if call.read_optional_str("type") not in (None, "function"):
            call.fail("type", 'must be "function"')
        function = call.read_object("function")
        call.refuse_unread()
        name = function.read_optional_str("name")
        arguments = function.read_optional_str("arguments")
        function.refuse_unread()
        if name is None:
            function.fail("name", "is required")
        entry: dict[str, Any] = {
            "type": "function",
            "function": {"name": name, "arguments": _template_arguments(arguments or "{}")},
        }
        if call_id is not None:
            entry["id"] = call_id
        calls.append(entry)
    return calls


def _template_arguments(arguments: str) -> Any:
    try:
        decoded = json.loads(arguments)
    except ValueError:
        return arguments
    return decoded if isinstance(decoded, dict) else arguments


def _read_content(
    item: Fields, content: object, images: list[ImageSource] | None
) -> str | list[dict[str, str]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        item.fail("content", f"expected a string or an array of parts, got {describe(content)}")
    parts = []
    for index, part in enumerate(content):
        param = f"content[{index}]"
        if not isinstance(part, dict):
            item.fail(param, f"expected an object, got {describe(part)}")
        kind = part.get("type")
        if kind == "image_url":
            if images is None:
                item.fail(f"{param}.type", _NO_IMAGES)
            images.append(read_image_url_part(Fields(part, item.param(f"{param}."))))
            parts.append({"type": "image"})
            continue
        if kind != "text":
            item.fail(f"{param}.type", f'must be "text" or "image_url", got {kind!r}')
        if not isinstance(part.get("text"), str):
            item.fail(f"{param}.text", "expected a string")
        parts.append({"type": "text", "text": part["text"]})
    return parts


_NO_IMAGES = (
    "image parts are taken only in user messages, by a model with a vision tower the server "
    "serves (and not started with --limit-mm-per-prompt image=0)"
)
