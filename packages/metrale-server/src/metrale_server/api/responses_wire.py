"""The Responses API's response objects: output items, usage, the response itself.

Whole and streamed responses are built from these, so the two agree field for field.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import attrs

from metrale_server.output.outputs import CompletionOutput


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": [output_text(text)],
    }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    """The reasoning parser's text, as both the summary and the content (this server writes
    no separate summary)."""
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [{"type": "summary_text", "text": text}],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def is_incomplete(output: CompletionOutput) -> bool:
    """An output cut short by ``max_output_tokens`` (or the context, or the request timeout)."""
    return output.finish_reason == "length"


@attrs.frozen(kw_only=True)
class ResponseHeader:
    """What a response repeats in its whole body and its lifecycle events."""

    id: str
    created_at: int
    model: str
    echo: dict[str, Any]
    num_input_tokens: int

    @classmethod
    def new(cls, model: str, echo: dict[str, Any], num_input_tokens: int) -> ResponseHeader:
        return cls(
            id=new_id("resp"),
            created_at=int(time.time()),
            model=model,
            echo=echo,
            num_input_tokens=num_input_tokens,
        )

    def body(
        self,
        output: list[dict[str, Any]],
        *,
        status: str,
        num_output_tokens: int | None = None,
        num_cached_tokens: int = 0,
    ) -> dict[str, Any]:
        """The response; ``usage`` is ``None`` until it is done (``num_output_tokens`` set)."""
        usage = None
        if num_output_tokens is not None:
            usage = {
                "input_tokens": self.num_input_tokens,
                "input_tokens_details": {
                    "cached_tokens": num_cached_tokens,
                    "cache_write_tokens": 0,
                },
                "output_tokens": num_output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.num_input_tokens + num_output_tokens,
            }
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            "usage": usage,
            **self.echo,
        }
