"""``GET /memory``'s document: the engine's plan and ledger with this moment's host readings."""

from __future__ import annotations

import torch

from metrale_bench.wire import MemoryReport
from metrale_model_arch.memory import MemoryPlan
from metrale_server.memory.host_memory import (
    mem_available_at_start_bytes,
    mem_available_bytes,
    rss_anon_bytes,
)
from metrale_server.memory.ledger import MemoryLedger


def memory_report(plan: MemoryPlan, ledger: MemoryLedger, device: torch.device) -> MemoryReport:
    """Readings that cannot be taken (no ``/proc``, no start sample) are ``None``."""
    inputs = plan.inputs
    return MemoryReport(
        kv_blocks=plan.kv_blocks,
        kv_block_bytes=plan.kv_block_bytes,
        max_batch_size=plan.max_batch_size,
        budget_bytes=plan.budget_bytes,
        ledger_live_bytes=ledger.live_bytes(),
        mem_available_at_start_bytes=mem_available_at_start_bytes(),
        mem_available_now_bytes=mem_available_bytes(),
        rss_anon_bytes=rss_anon_bytes(),
        device=str(device),
        total_bytes=inputs.total_bytes,
        gpu_memory_utilization=inputs.gpu_memory_utilization,
        block_size=inputs.block_size,
        max_seq_len=inputs.max_seq_len,
        kv_bytes_per_token=plan.kv_bytes_per_token,
        plan_by_owner=plan.by_owner(),
        ledger_by_owner=ledger.live_bytes_by_owner(),
        kv_cache_dtype=str(inputs.kv_cache_dtype),
    )
