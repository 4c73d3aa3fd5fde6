"""A one-line chart of recent values, in block characters."""

from __future__ import annotations

from collections.abc import Sequence

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int) -> str:
    """The last ``width`` values scaled to the largest of them, left-padded with spaces to
    exactly ``width`` characters; zeros draw as the lowest block."""
    if width <= 0:
        return ""
    shown = list(values)[-width:]
    top = max(shown, default=0.0)
    chars = [
        BLOCKS[0] if top <= 0 else BLOCKS[min(len(BLOCKS) - 1, int(v / top * (len(BLOCKS) - 1)))]
        for v in shown
    ]
    return " " * (width - len(chars)) + "".join(chars)
