"""``met top``'s plain-text snapshot: one reading of a server as ``label  value`` lines, for a
pipe, a log or a script (no terminal, or ``--once``)."""

from __future__ import annotations

import time

from metrale_server.tui.formatting import (
    format_bytes,
    format_percent,
    format_seconds,
    format_uptime,
)
from metrale_server.tui.snapshot import Snapshot, Status

LABEL_WIDTH = 12


def snapshot_lines(snapshot: Snapshot, *, now: float | None = None) -> list[str]:
    """What the dashboard's panels show, less the rates (one reading has none); a part the
    server did not answer is left out. ``now``: wall-clock seconds, for the uptime."""
    lines = [f"metrale {snapshot.status.value} at {snapshot.url}"]

    def add(label: str, value: str) -> None:
        lines.append(f"{label:<{LABEL_WIDTH}} {value}")

    info = snapshot.server
    model = info.model if info else snapshot.model
    if model:
        add("model", model if info is None else f"{model} ({info.dtype} on {info.device})")
    if snapshot.version:
        add("version", snapshot.version)
    if info is not None:
        now = time.time() if now is None else now
        add("uptime", format_uptime(now - info.started_at))
    if snapshot.status is Status.LOADING and snapshot.loading_progress is not None:
        done, total = snapshot.loading_progress
        add("loading", f"{done} / {total} checkpoint tensors")
    metrics = snapshot.metrics
    if metrics is not None:
        reasons = " ".join(f"{k}:{v}" for k, v in sorted(metrics.num_finished_by_reason.items()))
        finished = f"{metrics.num_finished}" + (f" ({reasons})" if reasons else "")
        add(
            "requests",
            f"running {metrics.num_running}, waiting {metrics.num_waiting}, "
            f"finished {finished}, preempted {metrics.num_preemptions}",
        )
        add(
            "tokens",
            f"prompt {metrics.num_prompt_tokens}, generated {metrics.num_generation_tokens}",
        )
        for name, buckets in (("TTFT", metrics.ttft), ("TPOT", metrics.tpot)):
            add(
                name,
                f"p50 {format_seconds(buckets.quantile(0.5))}, "
                f"p90 {format_seconds(buckets.quantile(0.9))} (since start)",
            )
        kv = f"{format_percent(metrics.kv_usage)} in use"
        if info is not None:
            kv += f" of {info.num_kv_blocks} blocks x {info.block_size} tokens"
            kv += (
                f", prefix hits {format_percent(metrics.prefix_hit_rate)}"
                if info.is_prefix_caching
                else ", prefix caching off"
            )
        add("KV cache", kv)
    memory = snapshot.memory
    if memory is not None:
        add(
            "memory",
            f"ledger {format_bytes(memory.ledger_live_bytes)} live, "
            f"budget {format_bytes(memory.budget_bytes)} on {memory.device}",
        )
    if snapshot.error:
        add("errors", snapshot.error)
    return lines
