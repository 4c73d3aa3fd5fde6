"""``met chat``'s loop: streamed replies, the conversation kept between turns, /reset, /exit."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from metrale_testing import serve_http_handler

from metrale_server import EngineArgs, build_engine
from metrale_server.cli.chat import ASSISTANT_PREFIX, run_chat
from metrale_server.tui.chat_backends import ChatError, EngineChatBackend, HttpChatBackend


def scripted(*lines: str) -> Any:
    queue = list(lines)

    def read_line(prompt: str) -> str:
        if not queue:
            raise EOFError
        return queue.pop(0)

    return read_line


@contextmanager
def echo_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A chat server that streams back "you said N messages" in three SSE chunks and records
    each request body."""
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._send(200, json.dumps({"data": [{"id": "echo"}]}).encode())

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            if body["messages"][-1]["content"] == "fail":
                self._send(400, json.dumps({"error": {"message": "refused"}}).encode())
                return
            pieces = ["you said ", str(len(body["messages"])), " messages"]
            events = [{"choices": [{"delta": {"content": p}}]} for p in pieces]
            frames = [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
            self._send(200, "".join(frames).encode())

        def _send(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serve_http_handler(Handler) as url:
        yield url, bodies


def test_the_conversation_is_kept_until_reset() -> None:
    out = io.StringIO()
    with echo_server() as (url, bodies):
        code = run_chat(
            HttpChatBackend(url),
            system_prompt="be brief",
            read_line=scripted("one", "two", "/reset", "three", "/exit", "never sent"),
            out=out,
        )
    assert code == 0
    assert [len(b["messages"]) for b in bodies] == [2, 4, 2]
    assert bodies[1]["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "you said 2 messages"},
        {"role": "user", "content": "two"},
    ]
    assert bodies[2]["messages"][-1] == {"role": "user", "content": "three"}
    assert all(b["stream"] is True and b["model"] == "echo" for b in bodies)
    text = out.getvalue()
    assert "chatting with echo" in text
    assert f"{ASSISTANT_PREFIX}you said 4 messages\n" in text
    assert "(conversation cleared)" in text


def test_a_refused_turn_is_reported_and_not_kept() -> None:
    out = io.StringIO()
    with echo_server() as (url, bodies):
        run_chat(HttpChatBackend(url), read_line=scripted("fail", "next"), out=out)
    assert "error: /v1/chat/completions: HTTP 400: refused" in out.getvalue()
    assert [m["content"] for m in bodies[1]["messages"]] == ["next"]


def test_an_unreachable_server_exits_1() -> None:
    with echo_server() as (url, _):
        pass
    out = io.StringIO()
    assert run_chat(HttpChatBackend(url), read_line=scripted("hi"), out=out) == 1
    assert "cannot reach" in out.getvalue()
    with pytest.raises(ChatError):
        list(HttpChatBackend(url, model="m").stream_reply([{"role": "user", "content": "x"}]))


def test_an_engine_in_this_process_streams_replies(tiny_model_dir: Path) -> None:
    engine = build_engine(EngineArgs(model=str(tiny_model_dir), dtype="float32", max_batch_size=2))
    backend = EngineChatBackend(engine, model_name="tiny", max_tokens=6, temperature=0.0)
    pieces = list(backend.stream_reply([{"role": "user", "content": "hello"}]))
    assert pieces
    assert engine.core.num_unfinished_requests == 0
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks
    out = io.StringIO()
    assert run_chat(backend, read_line=scripted("hello", "/help", "/nope"), out=out) == 0
    text = out.getvalue()
    assert f"{ASSISTANT_PREFIX}{''.join(pieces)}\n" in text  # greedy: the same reply again
    assert "unknown command /nope" in text
