"""A streamed response: the Responses API's events, ``event: <type>\\ndata: {json}\\n\\n`` each,
every one with a ``sequence_number`` (0, 1, 2...).

``response.created`` and ``response.in_progress`` (the response with no output yet), then per
output item ``response.output_item.added``, its deltas and ``response.output_item.done``:
reasoning (``response.reasoning_text.delta`` in one ``reasoning_text`` part), the message
(``response.content_part.added``, ``response.output_text.delta``s, ``.done`` and
``response.content_part.done``) and each function call (``response.function_call_arguments.
delta``s and ``.done``). Last ``response.completed`` (or ``response.incomplete``, cut short by
``max_output_tokens``) with the whole response. A failure mid-stream is an ``error`` event.

An item opens when its first text arrives. The reasoning item is done when another opens; a
call when the next call opens; the message stays open to the end (text the model writes after
a call belongs to it, as it does in a whole response), so items are done in output order
except the message.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

import attrs

from metrale_server.api.chat import choice_reader
from metrale_server.api.chat_output import ChatDelta
from metrale_server.api.errors import ApiError
from metrale_server.api.generation import Generation, merge_outputs
from metrale_server.api.responses import raise_if_failed
from metrale_server.api.responses_protocol import ResponsesRequest
from metrale_server.api.responses_store import StoredResponse
from metrale_server.api.responses_wire import (
    ResponseHeader,
    function_call_item,
    is_incomplete,
    message_item,
    new_id,
    output_text,
    reasoning_item,
)
from metrale_server.api.state import ServerState
from metrale_server.api.streaming import sse_event
from metrale_server.output.outputs import CompletionOutput


@attrs.define
class Sequencer:
    """Numbers one stream's events; shared by its events and the guard that ends it."""

    next_number: int = 0

    def event(self, payload: dict[str, Any]) -> str:
        """One SSE frame named by the payload's ``type``, numbered."""
        payload = {**payload, "sequence_number": self.next_number}
        self.next_number += 1
        return sse_event(payload, name=payload["type"])

    def error_frame(self, error: ApiError) -> str:
        """A failure mid-stream: an ``error`` event in OpenAI's shape, numbered."""
        return self.event(
            {"type": "error", "code": error.code, "message": error.message, "param": error.param}
        )


@attrs.define
class _Item:
    """One streamed output item: its kind, id, index and what it holds so far."""

    kind: str
    id: str
    index: int
    text: str = ""
    name: str = ""
    call_id: str = ""
    is_done: bool = False


class ItemStream:
    """One output's deltas → output item events; ``items`` the response's output at the end."""

    def __init__(self) -> None:
        self._items: list[_Item] = []
        self._reasoning: _Item | None = None
        self._message: _Item | None = None
        self._calls: dict[int, _Item] = {}  # the parser's call index -> item

    def feed(self, delta: ChatDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if delta.reasoning:
            if self._reasoning is None:
                self._reasoning = self._open("reasoning", events)
            self._reasoning.text += delta.reasoning
            events.append(
                self._delta("response.reasoning_text.delta", self._reasoning, delta.reasoning)
            )
        if delta.content:
            events += self._add_text(delta.content)
        for call in delta.calls:
            if call.name is not None:
                for item in self._calls.values():
                    events += self._done(item, "completed")
                item = self._open("function_call", events, name=call.name)
                self._calls[call.index] = item
            opened = self._calls.get(call.index)
            if call.arguments and opened is not None:
                opened.text += call.arguments
                events.append(
                    self._delta("response.function_call_arguments.delta", opened, call.arguments)
                )
        return events

    def close(self, *, status: str) -> list[dict[str, Any]]:
        """Every open item's done events (a message, empty, if there is no other item)."""
        events: list[dict[str, Any]] = []
        if not self._items:
            events += self._add_text("")
        for item in self._items:
            events += self._done(item, status)
        return events

    def output(self, status: str) -> list[dict[str, Any]]:
        return [_wire(item, status) for item in self._items]

    def _add_text(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._message is None:
            self._message = self._open("message", events)
            events.append(
                {
                    "type": "response.content_part.added",
                    **_place(self._message),
                    "part": output_text(""),
                }
            )
        if text:
            self._message.text += text
            events.append(self._delta("response.output_text.delta", self._message, text))
            events[-1]["logprobs"] = []
        return events

    def _open(self, kind: str, events: list[dict[str, Any]], name: str = "") -> _Item:
        if self._reasoning is not None:
            events += self._done(self._reasoning, "completed")
        prefix = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind]
        item = _Item(kind=kind, id=new_id(prefix), index=len(self._items), name=name)
        if kind == "function_call":
            item.call_id = new_id("call")
        self._items.append(item)
        added = _wire(item, "in_progress")
        if kind == "reasoning":
            added["summary"], added["content"] = [], []
        elif kind == "message":
            added["content"] = []
        events.append(
            {"type": "response.output_item.added", "output_index": item.index, "item": added}
        )
        if kind == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
            events.append({"type": "response.content_part.added", **_place(item), "part": part})
        return item

    def _done(self, item: _Item, status: str) -> list[dict[str, Any]]:
        if item.is_done:
            return []
        item.is_done = True
        events: list[dict[str, Any]] = []
        if item.kind == "reasoning":
            part = {"type": "reasoning_text", "text": item.text}
            events.append(
                {"type": "response.reasoning_text.done", **_place(item), "text": item.text}
            )
            events.append({"type": "response.content_part.done", **_place(item), "part": part})
        elif item.kind == "message":
            done = {"type": "response.output_text.done", **_place(item), "text": item.text}
            events.append({**done, "logprobs": []})
            part = output_text(item.text)
            events.append({"type": "response.content_part.done", **_place(item), "part": part})
        else:
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item.id,
                    "output_index": item.index,
                    "name": item.name,
                    "arguments": item.text,
                }
            )
        wire = _wire(item, status)
        events.append(
            {"type": "response.output_item.done", "output_index": item.index, "item": wire}
        )
        return events

    @staticmethod
    def _delta(kind: str, item: _Item, text: str) -> dict[str, Any]:
        if kind == "response.function_call_arguments.delta":
            return {"type": kind, "item_id": item.id, "output_index": item.index, "delta": text}
        return {"type": kind, **_place(item), "delta": text}


def _place(item: _Item) -> dict[str, Any]:
    return {"item_id": item.id, "output_index": item.index, "content_index": 0}


def _wire(item: _Item, status: str) -> dict[str, Any]:
    if item.kind == "reasoning":
        return reasoning_item(item.id, item.text)
    if item.kind == "message":
        return message_item(item.id, item.text, status)
    return function_call_item(item.id, item.call_id, item.name, item.text)


async def response_events(
    state: ServerState,
    request: ResponsesRequest,
    generations: Sequence[Generation],
    header: ResponseHeader,
    sequencer: Sequencer,
) -> AsyncGenerator[str, None]:
    """The events of one generation's response; stored at the end when ``store`` is set."""
    started = header.body([], status="in_progress")
    yield sequencer.event({"type": "response.created", "response": started})
    yield sequencer.event({"type": "response.in_progress", "response": started})
    reader = choice_reader(state, request.chat)
    items = ItemStream()
    final: CompletionOutput | None = None
    num_cached_tokens = 0
    merged = merge_outputs(generations)
    try:
        async for _, output in merged:
            raise_if_failed(output)
            if output.finished:
                num_cached_tokens = output.num_cached_tokens
            for completion in output.outputs:
                if not (completion.delta_text or completion.finished):
                    continue
                read = reader.feed(completion.delta_text, is_final=completion.finished)
                for event in items.feed(read):
                    yield sequencer.event(event)
                if completion.finished:
                    final = completion
    finally:
        await merged.aclose()
    assert final is not None
    status = "incomplete" if is_incomplete(final) else "completed"
    for event in items.close(status=status):
        yield sequencer.event(event)
    output_items = items.output(status)
    body = header.body(
        output_items,
        status=status,
        num_output_tokens=len(final.token_ids),
        num_cached_tokens=num_cached_tokens,
    )
    if request.store:
        state.response_store.put(
            StoredResponse(
                body=body, input_items=request.input_items, output_items=tuple(output_items)
            )
        )
    yield sequencer.event({"type": f"response.{status}", "response": body})
