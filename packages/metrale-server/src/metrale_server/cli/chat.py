"""``met chat``: a conversation in the terminal, streamed reply by reply.

The whole conversation goes with every turn; ``/reset`` forgets it, ``/exit`` (or Ctrl-D)
quits. Ctrl-C during a reply stops that reply (it is not kept); at the prompt it quits.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

import click

from metrale_server.cli.common import CONTEXT, locate_model, offline_option, revision_option
from metrale_server.cli.plan_options import PlanOptions, plan_options
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


@click.command(context_settings=CONTEXT)
@click.option(
    "--url",
    default=None,
    help="Chat with the server at URL (default http://127.0.0.1:8888 unless --model is given).",
)
@click.option(
    "--model",
    "-m",
    default=None,
    help="Run MODEL in this process instead of talking to a server: a local model directory, "
    "a .gguf file, or a Hugging Face repo id (org/name) from the HF hub cache, downloaded into "
    "it when missing.",
)
@revision_option
@offline_option
@click.option("--api-key", default=None, help="Sent to --url as 'Authorization: Bearer KEY'.")
@click.option("--system", default=None, help="A system message that starts the conversation.")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="New tokens at most per reply.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0.0),
    default=0.7,
    show_default=True,
    help="Sampling temperature; 0 is greedy.",
)
@plan_options
def chat(
    url: str | None,
    model: str | None,
    revision: str | None,
    offline: bool,
    plan: PlanOptions,
    api_key: str | None,
    system: str | None,
    max_tokens: int,
    temperature: float,
) -> None:
    """Chat in the terminal; replies stream. /reset forgets the conversation, /exit quits.

    With --model the engine runs here, shaped by the same engine flags as met serve's."""
    if url is not None and model is not None:
        raise click.UsageError("give --url or --model, not both")
    if model is None and (revision is not None or offline):
        raise click.UsageError("--revision and --offline go with --model")
    from metrale_server.tui.chat_backends import EngineChatBackend, HttpChatBackend

    backend: ChatBackend
    if model is not None:
        from metrale_server.engine.bootstrap import build_engine

        engine_model, _ = locate_model(model, revision=revision, offline=offline)
        try:
            engine = build_engine(plan.engine_args(engine_model))
            engine.wait_for_native_kernels()
        except (ValueError, OSError) as error:
            raise click.ClickException(str(error)) from error
        backend = EngineChatBackend(
            engine, model_name=model, max_tokens=max_tokens, temperature=temperature
        )
    else:
        backend = HttpChatBackend(
            url or "http://127.0.0.1:8888",
            api_key=api_key,
            max_tokens=max_tokens,
            temperature=temperature,
        )
    click.get_current_context().exit(run_chat(backend, system_prompt=system))
