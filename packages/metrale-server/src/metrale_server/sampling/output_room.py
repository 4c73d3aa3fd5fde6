"""``fit_max_tokens``: how many tokens a request may generate after its prompt, the one rule
the engine core and the HTTP API both apply (the API with its clients' field names)."""

from __future__ import annotations

import attrs


@attrs.frozen
class OutputRoomError(ValueError):
    """The prompt leaves no room for output (``max_tokens`` ``None``), or ``max_tokens``
    tokens after it would pass ``max_seq_len``."""

    num_prompt_tokens: int
    max_tokens: int | None
    max_seq_len: int

    def describe(self, *, max_tokens_param: str = "max_tokens") -> str:
        if self.max_tokens is None:
            return (
                f"the prompt has {self.num_prompt_tokens} tokens; the model's max_seq_len is "
                f"{self.max_seq_len}, which leaves no room for output"
            )
        return (
            f"{max_tokens_param}: the prompt ({self.num_prompt_tokens} tokens) + "
            f"{max_tokens_param} ({self.max_tokens}) exceeds the model's max_seq_len "
            f"({self.max_seq_len})"
        )

    def __str__(self) -> str:
        return self.describe()


def fit_max_tokens(
    num_prompt_tokens: int,
    max_tokens: int | None,
    max_seq_len: int,
    *,
    default: int | None = None,
) -> int:
    """``max_tokens``, or when not given ``default`` (at most the room left), or the room the
    prompt leaves in ``max_seq_len``. Raises ``OutputRoomError`` when there is none, or
    ``max_tokens`` does not fit."""
    room = max_seq_len - num_prompt_tokens
    if room < 1:
        raise OutputRoomError(num_prompt_tokens, None, max_seq_len)
    if max_tokens is None:
        return room if default is None else min(default, room)
    if max_tokens > room:
        raise OutputRoomError(num_prompt_tokens, max_tokens, max_seq_len)
    return max_tokens
