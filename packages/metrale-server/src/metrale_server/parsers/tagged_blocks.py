"""Calls written as ``<tool_call>...</tool_call>`` blocks among text (Hermes, GLM)."""

from __future__ import annotations

from collections.abc import Callable

from metrale_server.parsers.tool_stream import BROKEN_CALL, PartialCall, Scan, held_back

OPEN = "<tool_call>"
CLOSE = "</tool_call>"

# Reads a block's inner text: the call so far, or ``None`` when it is broken (once closed) or
# shows no call yet.
BlockReader = Callable[[str, bool], PartialCall | None]


def scan_tagged_blocks(text: str, *, is_final: bool, read_block: BlockReader) -> Scan:
    """Content is the text before the first block (trailing whitespace dropped) and, stripped,
    any text between or after blocks; a broken block's text is content too. An unclosed block
    at the end of the final text is read as if closed."""
    first = text.find(OPEN)
    if first < 0:
        if is_final:
            return Scan(content=text, calls=())
        return Scan(content=text[: len(text) - held_back(text, (OPEN,))].rstrip(), calls=())
    content = [text[:first].rstrip()]
    calls: list[PartialCall] = []
    position = first
    while True:
        block_start = position + len(OPEN)
        block_end = text.find(CLOSE, block_start)
        inner = text[block_start : len(text) if block_end < 0 else block_end]
        is_closed = block_end >= 0 or is_final
        call = read_block(inner, is_closed)
        if call is None and is_closed:
            end = len(text) if block_end < 0 else block_end + len(CLOSE)
            content.append(text[position:end].strip())
            calls.append(BROKEN_CALL)
        elif call is not None:
            calls.append(call)
        if not is_closed or block_end < 0:
            break
        position = block_end + len(CLOSE)
        following = text.find(OPEN, position)
        if following < 0 and not is_final:
            break  # the text after a block may still open another
        content.append(text[position : len(text) if following < 0 else following].strip())
        if following < 0:
            break
        position = following
    return Scan(content="\n".join(part for part in content if part), calls=tuple(calls))
