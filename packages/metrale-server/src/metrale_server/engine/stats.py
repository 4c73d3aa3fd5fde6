"""Counters the engine keeps, and the frozen snapshot it hands out."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class EngineStats:
    """Totals since the engine started."""

    num_steps: int = 0
    num_prompt_tokens_computed: int = 0
    num_generated_tokens: int = 0
    num_partial_prefill_chunks: int = 0
    num_forked_sequences: int = 0
    num_preemptions: int = 0
    num_finished_requests: int = 0
