"""``check_stop``: whether a sequence ends with the token just appended to it, and why.

Token-level stops only (stop token ids, EOS, ``max_tokens``, the context); a grammar's end is
the core's to find as it advances the grammar, and stop strings are text, found by the output
processor.
"""

from __future__ import annotations

from collections.abc import Container

import attrs

from metrale_server.engine.sequence import Sequence


@attrs.frozen
class StopReason:
    """``finish_reason`` ``stop`` or ``length``; ``stop_token_id`` when a stop token ended it
    (reported back to clients, as vLLM's ``stop_reason``)."""

    finish_reason: str
    stop_token_id: int | None = None


def check_stop(
    seq: Sequence, token_id: int, *, eos_token_ids: Container[int], max_seq_len: int
) -> StopReason | None:
    """Why ``seq`` ends with ``token_id``, which it has just appended; ``None`` when it goes
    on. In order: one of its stop token ids, EOS (unless ``ignore_eos``), its ``max_tokens``,
    then the context (``max_seq_len``)."""
    params = seq.params
    if token_id in params.stop_token_ids:
        return StopReason("stop", token_id)
    if not params.ignore_eos and token_id in eos_token_ids:
        return StopReason("stop")
    if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
        return StopReason("length")
    if seq.num_tokens >= max_seq_len:
        return StopReason("length")
    return None
