"""``met chat``: a conversation in the terminal, streamed reply by reply.

The whole conversation goes with every turn; ``/reset`` forgets it, ``/exit`` (or Ctrl-D)
quits. Ctrl-C during a reply stops that reply (it is not kept); at the prompt it quits.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from metrale_server.tui.chat_backends import ChatBackend, ChatError, Message

USER_PROMPT = "you> "
ASSISTANT_PREFIX = "assistant> "
HELP_TEXT = "/reset forgets the conversation, /exit quits, /help shows this"


def run_chat(
    backend: ChatBackend,
    *,
    system_prompt: str | None = None,
    read_line: Callable[[str], str] = input,
    out: TextIO | None = None,
) -> int:
    """Chat until ``/exit`` or end of input; returns 0."""
    out = sys.stdout if out is None else out
    try:
        model = backend.model_name
    except ChatError as error:
        print(f"error: {error}", file=out)
        return 1
    print(f"chatting with {model}; {HELP_TEXT}", file=out)
    base: list[Message] = (
        [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    )
    messages = list(base)
    while True:
        try:
            line = read_line(USER_PROMPT)
        except (EOFError, KeyboardInterrupt):
            print(file=out)
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            messages = list(base)
            print("(conversation cleared)", file=out)
            continue
        if text == "/help":
            print(HELP_TEXT, file=out)
            continue
        if text.startswith("/"):
            print(f"unknown command {text.split()[0]}; {HELP_TEXT}", file=out)
            continue
        reply = _stream_reply(backend, [*messages, {"role": "user", "content": text}], out)
        if reply is not None:
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]


def _stream_reply(backend: ChatBackend, messages: list[Message], out: TextIO) -> str | None:
    """The whole reply, written as it streams; ``None`` when it failed or was interrupted."""
    out.write(ASSISTANT_PREFIX)
    out.flush()
    pieces: list[str] = []
    stream = backend.stream_reply(messages)
    try:
        for piece in stream:
            pieces.append(piece)
            out.write(piece)
            out.flush()
    except ChatError as error:
        print(f"\nerror: {error}", file=out)
        return None
    except KeyboardInterrupt:
        print("\n(reply stopped)", file=out)
        return None
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    print(file=out)
    return "".join(pieces)
