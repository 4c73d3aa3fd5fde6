"""Reasoning parsers: ``<think>...</think>`` split into reasoning and content.

- ``deepseek_r1``: the output is reasoning from its start (the chat template may already have
  opened ``<think>``; one the model writes is dropped) until ``</think>``; without it, all of
  the output is reasoning.
- ``qwen3``: an output that opens with ``<think>`` is reasoning until ``</think>`` (or its end,
  when cut short); any other output is content (thinking was off).

Reasoning is stripped of surrounding whitespace and content of leading whitespace. Streamed,
the same split is sent piece by piece (text that may be a tag, and trailing whitespace, wait),
so the pieces concatenate to the whole split for any division into deltas.
"""

from __future__ import annotations

from metrale_server.parsers.tool_stream import held_back
from metrale_server.parsers.types import ReasoningSplit

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class ThinkReasoningParser:
    """One instance per output; ``is_open_tag_required`` tells qwen3 from deepseek_r1."""

    def __init__(self, *, is_open_tag_required: bool) -> None:
        self._is_open_tag_required = is_open_tag_required
        self._text = ""
        self._sent = ("", "")

    def parse(self, text: str) -> ReasoningSplit:
        reasoning, content = self._split(text, is_final=True)
        is_thinking = reasoning or not self._is_open_tag_required
        return ReasoningSplit(
            reasoning=reasoning or None if is_thinking else None, content=content or None
        )

    def feed(self, delta: str, *, is_final: bool) -> ReasoningSplit:
        self._text += delta
        reasoning, content = self._split(self._text, is_final=is_final)
        sent_reasoning, sent_content = self._sent
        self._sent = (reasoning, content)
        return ReasoningSplit(
            reasoning=reasoning[len(sent_reasoning) :], content=content[len(sent_content) :]
        )

    def _split(self, text: str, *, is_final: bool) -> tuple[str, str]:
        """(reasoning, content) readable from ``text`` so far; each only grows with it."""
        start = len(text) - len(text.lstrip())
        if text.startswith(THINK_OPEN, start):
            body = text[start + len(THINK_OPEN) :]
        elif not is_final and THINK_OPEN.startswith(text[start:]):
            return "", ""  # may still be the opening tag
        elif self._is_open_tag_required:
            return "", text[start:]
        else:
            body = text
        end = body.find(THINK_CLOSE)
        if end >= 0:
            return body[:end].strip(), body[end + len(THINK_CLOSE) :].lstrip()
        if is_final:
            return body.strip(), ""
        return body[: len(body) - held_back(body, (THINK_CLOSE,))].strip(), ""
