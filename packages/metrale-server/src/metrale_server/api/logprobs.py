"""Logprobs in OpenAI's two shapes: the legacy completions one and the chat one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from metrale_model_arch import Tokenizer
from metrale_server.output.outputs import TokenLogprob

# JSON has no -inf; OpenAI reports impossible tokens as -9999.0.
MIN_LOGPROB = -9999.0


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE spells byte ``b`` as one printable character; this maps it back."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(code): b for b, code in chars.items()}


_BYTE_OF_CHAR = _byte_level_alphabet()


def finite_logprob(logprob: float) -> float:
    return logprob if math.isfinite(logprob) and logprob > MIN_LOGPROB else MIN_LOGPROB


class TokenTexts:
    """Each token's text and raw bytes as logprobs report them, cached per id.

    A byte-level token that holds part of a character has text with U+FFFD but exact bytes.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}

    def text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._texts[token_id] = text
        return text

    def utf8(self, token_id: int) -> list[int]:
        raw = self._bytes.get(token_id)
        if raw is None:
            text = self.text(token_id)
            spelling = self._tokenizer.id_to_token(token_id) or ""
            if "\ufffd" in text and spelling and all(c in _BYTE_OF_CHAR for c in spelling):
                raw = [_BYTE_OF_CHAR[c] for c in spelling]
            else:
                raw = list(text.encode("utf-8"))
            self._bytes[token_id] = raw
        return raw


def completion_logprobs(
    entries: Sequence[TokenLogprob], texts: TokenTexts, *, text_offset: int
) -> dict[str, Any]:
    """``{tokens, token_logprobs, top_logprobs, text_offset}``; each top dict holds the chosen
    token plus the requested alternatives. ``text_offset`` is where the first token starts."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for entry in entries:
        token = texts.text(entry.token_id)
        tokens.append(token)
        token_logprobs.append(finite_logprob(entry.logprob))
        top = {token: finite_logprob(entry.logprob)}
        for token_id, logprob in entry.top:
            top.setdefault(texts.text(token_id), finite_logprob(logprob))
        tops.append(top)
        offsets.append(text_offset)
        text_offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def echo_logprobs(
    prompt_token_ids: Sequence[int],
    prompt_logprobs: Sequence[TokenLogprob | None],
    texts: TokenTexts,
) -> dict[str, Any]:
    """The echoed prompt's part of the legacy shape, from offset 0: its first token has no
    logprob (``null``, as OpenAI reports it), each later one its prompt logprob."""
    first = texts.text(prompt_token_ids[0])
    rest = completion_logprobs(
        [entry for entry in prompt_logprobs[1:] if entry is not None], texts, text_offset=len(first)
    )
    return {
        "tokens": [first, *rest["tokens"]],
        "token_logprobs": [None, *rest["token_logprobs"]],
        "top_logprobs": [None, *rest["top_logprobs"]],
        "text_offset": [0, *rest["text_offset"]],
    }


def joined_logprobs(head: dict[str, Any], tail: dict[str, Any]) -> dict[str, Any]:
    """Two consecutive parts of the legacy shape as one."""
    return {key: [*head[key], *tail[key]] for key in head}


def prompt_logprobs_body(
    entries: Sequence[TokenLogprob | None], texts: TokenTexts
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: per prompt token, ``null`` for the first, else by token id
    the chosen token and the alternatives, each ``{logprob, rank, decoded_token}``."""
    body: list[dict[str, dict[str, Any]] | None] = []
    for entry in entries:
        if entry is None:
            body.append(None)
            continue
        ranked = {str(entry.token_id): _ranked(entry.token_id, entry.logprob, entry.rank, texts)}
        for rank, (token_id, logprob) in enumerate(entry.top, start=1):
            ranked.setdefault(str(token_id), _ranked(token_id, logprob, rank, texts))
        body.append(ranked)
    return body


def _ranked(token_id: int, logprob: float, rank: int | None, texts: TokenTexts) -> dict[str, Any]:
    return {"logprob": finite_logprob(logprob), "rank": rank, "decoded_token": texts.text(token_id)}


def chat_logprobs(entries: Sequence[TokenLogprob], texts: TokenTexts) -> dict[str, Any]:
    """``{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}``."""
    return {
        "content": [
            {
                **_chat_token(entry.token_id, entry.logprob, texts),
                "top_logprobs": [
                    _chat_token(token_id, logprob, texts) for token_id, logprob in entry.top
                ],
            }
            for entry in entries
        ]
    }


def _chat_token(token_id: int, logprob: float, texts: TokenTexts) -> dict[str, Any]:
    return {
        "token": texts.text(token_id),
        "logprob": finite_logprob(logprob),
        "bytes": texts.utf8(token_id),
    }
