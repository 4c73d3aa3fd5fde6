"""``GET /memory``'s document: the engine's plan and ledger with this moment's host readings."""

from __future__ import annotations

from metrale_bench.wire import MemoryReport
from metrale_server.engine.engine import Engine
from metrale_server.memory.host_memory import (
    mem_available_at_start_bytes,
    mem_available_bytes,
    rss_anon_bytes,
)


def memory_report(engine: Engine) -> MemoryReport:
    """Readings that cannot be taken (no ``/proc``, no start sample) are ``None``."""
    plan = engine.plan
    inputs = plan.inputs
    return MemoryReport(
        kv_blocks=engine.num_kv_blocks,
        kv_block_bytes=plan.kv_block_bytes,
        max_batch_size=engine.max_batch_size,
        budget_bytes=plan.budget_bytes,
        ledger_live_bytes=engine.ledger.live_bytes(),
        mem_available_at_start_bytes=mem_available_at_start_bytes(),
        mem_available_now_bytes=mem_available_bytes(),
        rss_anon_bytes=rss_anon_bytes(),
        device=str(engine.loaded.device),
        total_bytes=inputs.total_bytes,
        gpu_memory_utilization=inputs.gpu_memory_utilization,
        block_size=inputs.block_size,
        max_seq_len=inputs.max_seq_len,
        kv_bytes_per_token=plan.kv_bytes_per_token,
        plan_by_owner=plan.by_owner(),
        ledger_by_owner=engine.ledger.live_bytes_by_owner(),
    )
