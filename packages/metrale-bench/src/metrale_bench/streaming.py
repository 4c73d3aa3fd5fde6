"""Send one streamed completion or chat request and time its chunks (``RequestOutcome``)."""

from __future__ import annotations

import json
import time
from typing import Any

import attrs
import httpx

from metrale_bench.datasets import BenchRequest
from metrale_bench.outcome import RequestOutcome
from metrale_bench.types import Api

MAX_ERROR_CHARS = 300


@attrs.frozen(kw_only=True)
class SamplingSpec:
    """Sampling fields sent with every request; ``ignore_eos`` (a vLLM extension) and ``seed``
    are sent only when set."""

    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False


def request_body(
    api: Api, model: str, request: BenchRequest, sampling: SamplingSpec
) -> dict[str, Any]:
    """The JSON body: streamed, asking for usage in the last chunk."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens,
        "temperature": sampling.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "chat":
        if not isinstance(request.prompt, str):
            raise ValueError("the chat endpoint takes text prompts, not token ids")
        body["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        body["prompt"] = request.prompt if isinstance(request.prompt, str) else [*request.prompt]
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    return body


def _chunk_text(choice: dict[str, Any]) -> str:
    text = choice.get("text")
    if isinstance(text, str):
        return text
    delta = choice.get("delta")
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else ""


@attrs.define(eq=False)
class _ChunkClock:
    """Timestamps of a stream's chunks, relative to when the request was sent."""

    sent_at: float
    ttft_s: float | None = None
    last_text_at: float | None = None
    last_choice_at: float | None = None
    itl_s: list[float] = attrs.field(factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None

    def see(self, chunk: dict[str, Any], now: float) -> None:
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        self.last_choice_at = now
        if _chunk_text(choice):
            if self.last_text_at is None:
                self.ttft_s = now - self.sent_at
            else:
                self.itl_s.append(now - self.last_text_at)
            self.last_text_at = now
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]


async def stream_request(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], *, run_start: float
) -> RequestOutcome:
    """POST ``body`` to ``path`` and read its SSE stream; never raises for a failed request.

    A request fails unless it answered 200, streamed at least one chunk with text, gave a
    finish reason, and reported ``usage.completion_tokens`` >= 1 with ``prompt_tokens``.
    """
    sent_at = time.perf_counter()
    clock = _ChunkClock(sent_at=sent_at)

    def outcome(error: str | None) -> RequestOutcome:
        now = time.perf_counter()
        usage = clock.usage or {}
        ended_at = (
            now if error is not None or clock.last_choice_at is None else clock.last_choice_at
        )
        return RequestOutcome(
            start_s=sent_at - run_start,
            latency_s=ended_at - sent_at,
            ttft_s=clock.ttft_s,
            itl_s=tuple(clock.itl_s),
            prompt_tokens=_count(usage.get("prompt_tokens")),
            output_tokens=_count(usage.get("completion_tokens")),
            finish_reason=clock.finish_reason,
            error=None if error is None else error[:MAX_ERROR_CHARS],
        )

    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", errors="replace")
                return outcome(f"HTTP {response.status_code}: {text}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    return outcome(f"a stream chunk is not JSON: {data}")
                if not isinstance(chunk, dict):
                    return outcome(f"a stream chunk is not a JSON object: {data}")
                if "error" in chunk:
                    return outcome(f"error in stream: {json.dumps(chunk['error'])}")
                clock.see(chunk, now)
    except httpx.HTTPError as error:
        return outcome(f"{type(error).__name__}: {error}")
    return outcome(_stream_problem(clock))


def _stream_problem(clock: _ChunkClock) -> str | None:
    if clock.ttft_s is None:
        return "the stream carried no text"
    if clock.finish_reason is None:
        return "the stream ended without a finish reason"
    if clock.usage is None:
        return "the stream reported no usage"
    completion_tokens = clock.usage.get("completion_tokens")
    if not isinstance(completion_tokens, int) or completion_tokens < 1:
        return f"usage.completion_tokens is {completion_tokens!r}"
    if not isinstance(clock.usage.get("prompt_tokens"), int):
        return f"usage.prompt_tokens is {clock.usage.get('prompt_tokens')!r}"
    return None


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
