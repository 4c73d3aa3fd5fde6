"""Incremental detokenization that never emits half a UTF-8 character."""

from __future__ import annotations

from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int], *, skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text pieces.

    A byte-level BPE token can hold part of a multi-byte character; the decoder renders such a
    tail as U+FFFD, so text is held back until the tail completes. Only a short window of
    recent tokens is decoded each time, so the cost per token stays constant.
    """

    def __init__(self, decoder: Decoder, *, skip_special_tokens: bool = True) -> None:
        self._decoder = decoder
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_start = 0  # tokens before this are fully emitted and never decoded again
        self._read_start = 0  # text of ids[_prefix_start:_read_start] is already emitted

    def _decode(self, ids: list[int]) -> str:
        return self._decoder.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly empty)."""
        self._ids.append(token_id)
        emitted = self._decode(self._ids[self._prefix_start : self._read_start])
        full = self._decode(self._ids[self._prefix_start :])
        if len(full) <= len(emitted) or full.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix_start = self._read_start
        self._read_start = len(self._ids)
        return full[len(emitted) :]

    def flush(self) -> str:
        """Whatever is still held back at the end of the stream (a dangling partial character)."""
        emitted = self._decode(self._ids[self._prefix_start : self._read_start])
        full = self._decode(self._ids[self._prefix_start :])
        self._prefix_start = self._read_start = len(self._ids)
        return full[len(emitted) :]
