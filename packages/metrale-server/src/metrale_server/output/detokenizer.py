"""Incremental detokenization that never emits half a UTF-8 character."""

from __future__ import annotations

from typing import Any, Protocol

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.decoders import DecodeStream

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int], *, skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text pieces.

    A byte-level BPE token can hold part of a multi-byte character; such a tail is held back
    until it completes. With a ``tokenizers`` backend (the decoder's ``backend``), each token
    is one step of the library's ``DecodeStream``; otherwise a short window of recent tokens
    is decoded, and a window that ends in U+FFFD waits. Either way the cost per token is
    constant.
    """

    def __init__(self, decoder: Decoder, *, skip_special_tokens: bool = True) -> None:
        self._decoder = decoder
        self._skip_special_tokens = skip_special_tokens
        backend: Any = getattr(decoder, "backend", None)
        self._backend = backend if isinstance(backend, BackendTokenizer) else None
        self._stream = (
            DecodeStream(skip_special_tokens=skip_special_tokens)
            if self._backend is not None
            else None
        )
        self._ids: list[int] = []
        self._prefix_start = 0  # tokens before this are fully emitted and never decoded again
        self._read_start = 0  # text of ids[_prefix_start:_read_start] is already emitted
        self._emitted = ""  # that text

    def _decode(self, ids: list[int]) -> str:
        return self._decoder.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly empty)."""
        self._ids.append(token_id)
        if self._stream is not None and self._backend is not None:
            piece = self._stream.step(self._backend, token_id)
            if piece is None:
                return ""
            self._prefix_start = self._read_start = len(self._ids)
            return str(piece)
        full = self._decode(self._ids[self._prefix_start :])
        if len(full) <= len(self._emitted) or full.endswith(REPLACEMENT_CHAR):
            return ""
        piece = full[len(self._emitted) :]
        self._emitted = self._decode(self._ids[self._read_start :])
        self._prefix_start = self._read_start
        self._read_start = len(self._ids)
        return piece

    def flush(self) -> str:
        """Whatever is still held back at the end of the stream (a dangling partial character)."""
        if self._stream is not None:
            held = self._ids[self._read_start :]
            self._prefix_start = self._read_start = len(self._ids)
            return self._decode(held) if held else ""
        full = self._decode(self._ids[self._prefix_start :])
        self._prefix_start = self._read_start = len(self._ids)
        return full[len(self._emitted) :]
