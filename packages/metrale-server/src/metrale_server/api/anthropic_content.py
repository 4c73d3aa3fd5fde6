"""Anthropic's ``system`` and ``messages`` → the chat messages the chat route renders.

A ``user`` message's blocks become, in their order, user messages (runs of ``text`` and
``image`` blocks, an image as the chat route's ``image_url`` part) and ``tool`` messages (each
``tool_result``, ``tool_call_id`` its ``tool_use_id``). An ``assistant`` message becomes one
assistant message: its ``text`` blocks the content, its ``tool_use`` blocks ``tool_calls``
(``input`` as JSON arguments), its ``thinking`` blocks ``reasoning_content``. ``cache_control``
is accepted on any block and changes nothing (the prefix cache needs no breakpoints); a
``tool_result``'s ``is_error`` is accepted, and the chat template has no place for it.
Documents, citations, ``redacted_thinking`` and server tool blocks are 400s naming the block,
as is a last message from the assistant (a prefill: the chat template cannot leave the
assistant's turn open).
"""

from __future__ import annotations

import json
from typing import Any

from metrale_server.api.fields import Fields, describe

ROLES = ("user", "assistant")
BLOCK_TYPES = {
    "user": ("text", "image", "tool_result"),
    "assistant": ("text", "tool_use", "thinking"),
}
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def read_system(fields: Fields) -> dict[str, Any] | None:
    """The ``system`` prompt (a string or text blocks) as a system message, or ``None``."""
    value = fields.raw("system")
    if value is None:
        return None
    if isinstance(value, str):
        return {"role": "system", "content": value}
    if not isinstance(value, list):
        fields.fail(
            "system", f"expected a string or an array of text blocks, got {describe(value)}"
        )
    parts = [
        _read_text(_block(fields, f"system[{index}]", block), "text")
        for index, block in enumerate(value)
    ]
    return {"role": "system", "content": parts}


def read_messages(fields: Fields) -> list[dict[str, Any]]:
    """``messages`` as chat messages; every refusal names the message or block at fault."""
    value = fields.read_nonempty_list("messages")
    chat: list[dict[str, Any]] = []
    tool_use_ids: set[str] = set()
    for index, message in enumerate(value):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            fields.fail(param, f"expected an object, got {describe(message)}")
        item = Fields(message, fields.param(f"{param}."))
        role = item.raw("role")
        if role not in ROLES:
            item.fail("role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        blocks = _read_blocks(item, role)
        if role == "user":
            chat.extend(_user_messages(blocks, tool_use_ids))
        else:
            chat.append(_assistant_message(blocks, tool_use_ids))
        item.refuse_unread()
        if role == "assistant" and index == len(value) - 1:
            item.fail(
                "role",
                "the last message must be the user's: continuing an assistant message "
                "(prefill) is not supported",
            )
    return chat


def _read_blocks(item: Fields, role: str) -> list[tuple[str, Fields]]:
    """The message's content as ``(type, block fields)``; a string is one text block."""
    content = item.raw("content")
    if isinstance(content, str):
        return [("text", Fields({"type": "text", "text": content}, item.param("content.")))]
    if not isinstance(content, list):
        item.fail("content", f"expected a string or an array of blocks, got {describe(content)}")
    if not content:
        item.fail("content", "must not be empty")
    blocks = []
    allowed = BLOCK_TYPES[role]
    for index, value in enumerate(content):
        block = _block(item, f"content[{index}]", value)
        kind = block.read_optional_str("type")
        if kind not in allowed:
            block.fail(
                "type",
                f"{role} messages may hold {', '.join(allowed)} blocks here, got {kind!r}",
            )
        blocks.append((kind, block))
    return blocks


def _block(fields: Fields, param: str, value: object) -> Fields:
    if not isinstance(value, dict):
        fields.fail(param, f"expected an object, got {describe(value)}")
    return Fields(value, fields.param(f"{param}."))


def _read_text(block: Fields, kind: str) -> dict[str, str]:
    if block.read_optional_str("type") != kind:
        block.fail("type", f'must be "{kind}"')
    text = block.read_optional_str("text")
    if text is None:
        block.fail("text", "is required")
    block.read_object("cache_control")
    block.refuse_unread()  # citations among them
    return {"type": "text", "text": text}


def _user_messages(
    blocks: list[tuple[str, Fields]], tool_use_ids: set[str]
) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for kind, block in blocks:
        if kind == "tool_result":
            messages.append(_tool_message(block, tool_use_ids))
            continue
        part = _read_image(block) if kind == "image" else _read_text(block, "text")
        if messages and messages[-1]["role"] == "user":
            messages[-1]["content"].append(part)
        else:
            messages.append({"role": "user", "content": [part]})
    return messages


def _read_image(block: Fields) -> dict[str, Any]:
    """An ``image`` block (``source`` base64 or url) as the chat route's ``image_url`` part,
    which reads, limits and prepares it."""
    block.read_optional_str("type")
    source = block.read_object("source")
    kind = source.read_optional_str("type")
    if kind == "base64":
        media_type = source.read_optional_str("media_type")
        if media_type not in IMAGE_MEDIA_TYPES:
            source.fail("media_type", f"must be one of {', '.join(IMAGE_MEDIA_TYPES)}")
        data = source.read_optional_str("data")
        if data is None:
            source.fail("data", "is required")
        url = f"data:{media_type};base64,{data}"
    elif kind == "url":
        read = source.read_optional_str("url")
        if read is None:
            source.fail("url", "is required")
        url = read
    else:
        source.fail("type", f'must be "base64" or "url", got {kind!r}')
    source.refuse_unread()
    block.read_object("cache_control")
    block.refuse_unread()
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_message(block: Fields, tool_use_ids: set[str]) -> dict[str, Any]:
    tool_use_id = block.read_optional_str("tool_use_id")
    if tool_use_id is None:
        block.fail("tool_use_id", "is required")
    if tool_use_id not in tool_use_ids:
        block.fail("tool_use_id", f"{tool_use_id!r} is not the id of an earlier tool_use block")
    block.read_bool("is_error", False)
    block.read_object("cache_control")
    content = block.raw("content")
    if content is None:
        content = ""
    elif isinstance(content, list):
        content = [
            _read_text(_block(block, f"content[{index}]", part), "text")
            for index, part in enumerate(content)
        ]
    elif not isinstance(content, str):
        block.fail(
            "content", f"expected a string or an array of text blocks, got {describe(content)}"
        )
    block.refuse_unread()
    return {"role": "tool", "tool_call_id": tool_use_id, "content": content}


def _assistant_message(blocks: list[tuple[str, Fields]], tool_use_ids: set[str]) -> dict[str, Any]:
    parts: list[dict[str, str]] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    for kind, block in blocks:
        if kind == "text":
            parts.append(_read_text(block, "text"))
        elif kind == "thinking":
            thinking = block.read_optional_str("thinking")
            if thinking is None:
                block.fail("thinking", "is required")
            block.read_optional_str("signature")  # this server signs nothing
            block.refuse_unread()
            thoughts.append(thinking)
        else:
            calls.append(_tool_call(block, tool_use_ids))
    message: dict[str, Any] = {"role": "assistant", "content": parts or ""}
    if calls:
        message["tool_calls"] = calls
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    return message


def _tool_call(block: Fields, tool_use_ids: set[str]) -> dict[str, Any]:
    call_id = block.read_optional_str("id")
    if call_id is None:
        block.fail("id", "is required")
    name = block.read_optional_str("name")
    if name is None:
        block.fail("name", "is required")
    arguments = block.raw("input")
    if not isinstance(arguments, dict):
        block.fail("input", f"expected an object, got {describe(arguments)}")
    block.read_object("cache_control")
    block.refuse_unread()
    tool_use_ids.add(call_id)
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }
