"""Where ``met chat`` gets its replies: a server over HTTP, or an engine in this process.

Both stream the reply of the assistant to a whole conversation (a list of ``role``/``content``
messages) as text pieces, in order.
"""

from __future__ import annotations

import itertools
import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from metrale_server.sampling.params import SamplingParams

if TYPE_CHECKING:
    from metrale_server.engine.engine import Engine

Message = Mapping[str, str]


class ChatError(RuntimeError):
    """The reply could not be made (server unreachable, request refused); says why."""


class ChatBackend(Protocol):
    """Streams the assistant's next reply to ``messages``."""

    @property
    def model_name(self) -> str: ...

    def stream_reply(self, messages: Sequence[Message]) -> Iterator[str]: ...


class HttpChatBackend:
    """``POST /v1/chat/completions`` with ``stream: true``, read as server-sent events."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float = 0.7,
        timeout_s: float = 600.0,
    ) -> None:
        self.url = url.rstrip("/")
        self._api_key = api_key
        self._max_tokens = max_tokens
        self._temperature = temperature
        self._timeout_s = timeout_s
        self._model = model

    @property
    def model_name(self) -> str:
        if self._model is None:
            data = json.loads(self._open("/v1/models", None).read())
            models = data.get("data") or []
            if not models:
                raise ChatError(f"{self.url}/v1/models lists no model")
            self._model = str(models[0]["id"])
        return self._model

    def stream_reply(self, messages: Sequence[Message]) -> Iterator[str]:
        body: dict[str, Any] = {
            "model": self.model_name,
            "messages": [dict(m) for m in messages],
            "stream": True,
            "temperature": self._temperature,
        }
        if self._max_tokens is not None:
            body["max_tokens"] = self._max_tokens
        response = self._open("/v1/chat/completions", body)
        with response:
            for raw in response:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                payload = line.removeprefix("data:").strip()
                if payload == "[DONE]":
                    return
                event = json.loads(payload)
                if "error" in event:
                    raise ChatError(str(event["error"].get("message", event["error"])))
                for choice in event.get("choices", []):
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        yield str(content)

    def _open(self, path: str, body: Mapping[str, Any] | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self._api_key:
            request.add_header("Authorization", f"Bearer {self._api_key}")
        try:
            return urllib.request.urlopen(request, timeout=self._timeout_s)
        except urllib.error.HTTPError as error:
            message = _error_message(error.read())
            raise ChatError(f"{path}: HTTP {error.code}: {message}") from error
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ChatError(f"cannot reach {self.url}: {reason}") from error


class EngineChatBackend:
    """Replies from an ``Engine`` driven on the calling thread, one request at a time."""

    def __init__(
        self,
        engine: Engine,
        *,
        model_name: str,
        max_tokens: int | None = None,
        temperature: float = 0.7,
    ) -> None:
        self.engine = engine
        self._model_name = model_name
        self._max_tokens = max_tokens
        self._temperature = temperature
        self._request_ids = (f"chat-{i}" for i in itertools.count())

    @property
    def model_name(self) -> str:
        return self._model_name

    def stream_reply(self, messages: Sequence[Message]) -> Iterator[str]:
        loaded = self.engine.loaded
        text = loaded.render_chat([dict(m) for m in messages], add_generation_prompt=True)
        prompt_ids = loaded.tokenizer.encode(text, add_special_tokens=False)
        request_id = next(self._request_ids)
        params = SamplingParams(max_tokens=self._max_tokens, temperature=self._temperature)
        try:
            self.engine.add_request(request_id, prompt_ids, params)
        except ValueError as error:  # RequestError: the engine refused the request
            raise ChatError(str(error)) from error
        try:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.error is not None:
                        raise ChatError(output.error)
                    for completion in output.outputs:
                        if completion.delta_text:
                            yield completion.delta_text
        finally:
            self.engine.abort(request_id)


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", errors="replace")[:200]
