"""The Messages API's response objects: content blocks, stop reasons, the message itself.

Whole and streamed messages are built from these, so the two agree field for field.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import attrs

from metrale_server.output.outputs import CompletionOutput


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


@attrs.frozen
class TextBlock:
    text: str

    def to_wire(self) -> dict[str, Any]:
        return {"type": "text", "text": self.text}


@attrs.frozen
class ThinkingBlock:
    """The model's reasoning, as the server's ``--reasoning-parser`` read it; unsigned (the
    signature is empty: nothing here verifies a thinking block sent back)."""

    thinking: str

    def to_wire(self) -> dict[str, Any]:
        return {"type": "thinking", "thinking": self.thinking, "signature": ""}


@attrs.frozen
class ToolUseBlock:
    id: str
    name: str
    input: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": self.input}


ContentBlock = TextBlock | ThinkingBlock | ToolUseBlock


def tool_input(arguments: str) -> dict[str, Any] | None:
    """A call's JSON arguments as its ``input`` object (no text: ``{}``); ``None`` when they
    are not a JSON object (an output cut short in the middle of them)."""
    if not arguments.strip():
        return {}
    try:
        decoded = json.loads(arguments)
    except ValueError:
        return None
    return decoded if isinstance(decoded, dict) else None


@attrs.frozen(kw_only=True)
class StopReason:
    reason: str
    sequence: str | None


def stop_reason(output: CompletionOutput, *, has_tool_use: bool) -> StopReason:
    """``max_tokens`` for an output cut short (the request timeout included), ``tool_use``
    when the model called a tool, ``stop_sequence`` for a stop sequence, else ``end_turn``."""
    if output.finish_reason == "length":
        return StopReason(reason="max_tokens", sequence=None)
    if has_tool_use:
        return StopReason(reason="tool_use", sequence=None)
    if isinstance(output.stop_reason, str):
        return StopReason(reason="stop_sequence", sequence=output.stop_reason)
    return StopReason(reason="end_turn", sequence=None)


@attrs.frozen(kw_only=True)
class MessageHeader:
    """The fields a message repeats in its whole body and its ``message_start`` event."""

    id: str
    model: str
    num_input_tokens: int

    def body(
        self, content: list[ContentBlock], stop: StopReason | None, num_output_tokens: int
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [block.to_wire() for block in content],
            "stop_reason": None if stop is None else stop.reason,
            "stop_sequence": None if stop is None else stop.sequence,
            "usage": self.usage(num_output_tokens),
        }

    def usage(self, num_output_tokens: int) -> dict[str, int]:
        return {"input_tokens": self.num_input_tokens, "output_tokens": num_output_tokens}
