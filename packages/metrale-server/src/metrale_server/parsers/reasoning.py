"""Reasoning parsers: an output's ``<think>...</think>`` block split off as reasoning.

- ``deepseek_r1`` (DeepSeek-R1, and models whose template opens ``<think>`` in the prompt,
  as Qwen3's Thinking-2507 models): the output is reasoning from its start (a ``<think>`` the
  model writes first is dropped) until ``</think>``; without one, all of it is reasoning.
- ``qwen3``: an output that opens with ``<think>`` is reasoning until ``</think>``; any other
  output is content (thinking was off). An output that opened ``<think>`` and never closed it
  (cut short) is all reasoning: that is what a stream must have sent while it was being
  written, so the whole reading agrees (vLLM's whole reading calls it content instead).

Reasoning is stripped of surrounding whitespace and the content of leading whitespace; either
is ``None`` in ``parse`` when empty. ``feed`` returns the new reasoning and content text of
each delta, ``""`` (never ``None``) when there is none. Text that may be a tag, and trailing
reasoning whitespace, wait for the next delta, so for any split into deltas the pieces
concatenate to ``parse``'s split (``None`` as ``""``). The one thing a stream cannot know in
advance is whether ``qwen3``'s output will open ``<think>``: it waits while the output's
first characters could still be that tag, then treats the output as ``parse`` does.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

import attrs

from metrale_server.parsers.reading import held_back, may_become

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@attrs.frozen
class ReasoningSplit:
    """Reasoning and content text: whole (``None`` when there is none) or a delta (``""``)."""

    reasoning: str | None
    content: str | None


class ReasoningParser(Protocol):
    """Splits one output (make one per output: ``feed`` keeps the stream's state)."""

    def parse(self, text: str) -> ReasoningSplit: ...

    def feed(self, delta: str, *, is_final: bool) -> ReasoningSplit: ...


class _Phase(enum.Enum):
    START = enum.auto()  # not yet known whether the output opens <think>
    REASONING = enum.auto()
    CONTENT = enum.auto()


class _ThinkSplitter:
    """Reads an output as it grows; ``advance`` returns the new (reasoning, content)."""

    def __init__(self, *, is_open_tag_required: bool) -> None:
        self._is_open_tag_required = is_open_tag_required
        self._phase = _Phase.START
        self._position = 0  # the first character not handed over yet
        self._reasoning_started = False
        self._pending = ""  # reasoning whitespace held back
        self._content_started = False

    def advance(self, text: str, *, is_final: bool) -> tuple[str, str]:
        reasoning = content = ""
        if self._phase is _Phase.START:
            start = len(text) - len(text.lstrip())
            if text.startswith(THINK_OPEN, start):
                self._position = start + len(THINK_OPEN)
                self._phase = _Phase.REASONING
            elif not is_final and may_become(text, start, THINK_OPEN):
                return "", ""
            elif self._is_open_tag_required:
                self._phase = _Phase.CONTENT
            else:
                self._phase = _Phase.REASONING
        if self._phase is _Phase.REASONING:
            found = text.find(THINK_CLOSE, self._position)
            if found < 0:
                stop = (
                    len(text)
                    if is_final
                    else len(text) - held_back(text, self._position, THINK_CLOSE)
                )
                reasoning = self._reasoning(text[self._position : stop])
                self._position = stop
                return reasoning, ""
            reasoning = self._reasoning(text[self._position : found])
            self._position = found + len(THINK_CLOSE)
            self._phase = _Phase.CONTENT
        content = text[self._position :]
        self._position = len(text)
        if not self._content_started:
            content = content.lstrip()
            self._content_started = bool(content)
        return reasoning, content

    def _reasoning(self, text: str) -> str:
        """Reasoning text, stripped: leading whitespace dropped, trailing whitespace held
        until more reasoning follows it (and dropped when none does)."""
        if not self._reasoning_started:
            text = text.lstrip()
            self._reasoning_started = bool(text)
        body = text.rstrip()
        if not body:
            self._pending += text
            return ""
        sent = self._pending + body
        self._pending = text[len(body) :]
        return sent


class ThinkReasoningParser:
    """One instance per output; ``is_open_tag_required`` tells ``qwen3`` from
    ``deepseek_r1``."""

    def __init__(self, *, is_open_tag_required: bool) -> None:
        self._new_splitter: Callable[[], _ThinkSplitter] = lambda: _ThinkSplitter(
            is_open_tag_required=is_open_tag_required
        )
        self._splitter = self._new_splitter()
        self._text = ""
        self._is_finished = False

    def parse(self, text: str) -> ReasoningSplit:
        reasoning, content = self._new_splitter().advance(text, is_final=True)
        return ReasoningSplit(reasoning=reasoning or None, content=content or None)

    def feed(self, delta: str, *, is_final: bool) -> ReasoningSplit:
        if self._is_finished:
            raise ValueError("this output's stream already ended (is_final was set)")
        self._is_finished = is_final
        self._text += delta
        reasoning, content = self._splitter.advance(self._text, is_final=is_final)
        return ReasoningSplit(reasoning=reasoning, content=content)
