"""The Responses API's stored responses: ``store`` (true by default, as OpenAI's) keeps a
response for ``previous_response_id``, ``GET`` and ``DELETE /v1/responses/{id}``.

A bounded LRU in host memory (``MAX_STORED_RESPONSES`` responses), lost on restart and outside
the memory plan: each entry holds its whole conversation (the input items of the chain so far
and the response's output items), so its size is bounded by the request body limit, not by the
KV cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import attrs

MAX_STORED_RESPONSES = 256


@attrs.frozen(kw_only=True)
class StoredResponse:
    """``body`` the response object; ``input_items`` every input item of the conversation up
    to it (the previous responses' inputs and outputs, then its own input); ``output_items``
    its output."""

    body: dict[str, Any]
    input_items: tuple[dict[str, Any], ...]
    output_items: tuple[dict[str, Any], ...]


class ResponseStore:
    """Thread-safe: requests are parsed on the preparation threads, stored on the event loop."""

    def __init__(self, capacity: int = MAX_STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def put(self, response: StoredResponse) -> None:
        with self._lock:
            self._entries[response.body["id"]] = response
            self._entries.move_to_end(response.body["id"])
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._entries.pop(response_id, None) is not None
