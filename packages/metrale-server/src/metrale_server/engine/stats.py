"""``EngineStats``: the engine core's counters and gauges, as one frozen snapshot.

The engine thread replaces the snapshot after every step; readers on other threads (``/metrics``,
the dashboard) read one reference and never touch the scheduler or block manager.
"""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class EngineStats:
    """Totals since the engine started, and the gauges of the last step."""

    num_steps: int = 0
    num_prompt_tokens_computed: int = 0
    num_generated_tokens: int = 0
    num_partial_prefill_chunks: int = 0
    num_forked_sequences: int = 0
    num_preemptions: int = 0
    num_finished_requests: int = 0
    num_running_seqs: int = 0
    num_running_requests: int = 0
    num_waiting_requests: int = 0
    num_free_kv_blocks: int = 0
    num_kv_blocks: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # Drafts kept at each draft position (0: the first token after the sequence's last one).
    num_accepted_by_position: tuple[int, ...] = ()
    # Images run through the vision tower, and images whose encoding the cache held.
    num_images_encoded: int = 0
    num_image_cache_hits: int = 0

    @property
    def kv_cache_usage(self) -> float:
        if not self.num_kv_blocks:
            return 0.0
        return 1.0 - self.num_free_kv_blocks / self.num_kv_blocks
