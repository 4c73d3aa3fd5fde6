"""Finding stop strings in generated text, including ones that span token boundaries."""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Searches the tail of a growing text for any of ``stops``."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self._longest = max((len(s) for s in self.stops), default=0)

    def find(self, text: str, num_new_chars: int) -> tuple[int, str] | None:
        """``(index, stop)`` of the earliest stop that ends inside the last ``num_new_chars``.

        Only the new tail (plus enough old text for a stop to straddle it) is searched, so a
        stop that was already absent is not searched for again.
        """
        if not self.stops or num_new_chars <= 0:
            return None
        start = max(0, len(text) - num_new_chars - self._longest + 1)
        found: tuple[int, str] | None = None
        for stop in self.stops:
            index = text.find(stop, start)
            if index != -1 and (found is None or index < found[0]):
                found = (index, stop)
        return found

    def num_held_chars(self, text: str) -> int:
        """How many trailing characters might be the start of a stop string (not safe to stream)."""
        held = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:length]):
                    held = length
                    break
        return held
