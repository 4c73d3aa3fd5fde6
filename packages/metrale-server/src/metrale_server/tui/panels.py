"""The dashboard's panels, each a pure function of the ``DashboardView``.

Every line is cut to the panel's width (ellipsis), so no panel ever wraps a line. Request
rows carry ids, counts, latencies and finish reasons only: no prompt or output text.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from metrale_server.api.recent_requests import FinishedRequest
from metrale_server.tui.formatting import (
    NOT_AVAILABLE,
    format_bytes,
    format_percent,
    format_rate,
    format_seconds,
)
from metrale_server.tui.sparkline import sparkline
from metrale_server.tui.view import DashboardView

HELP_LINES = (
    ("q", "quit (met serve drains in-flight requests first)"),
    ("tab", "next panel: Overview, Requests, Memory, Log"),
    ("?", "show or hide this help"),
)


def _panel(body: RenderableType, title: str) -> Panel:
    return Panel(body, title=title, title_align="left", border_style="grey50", padding=(0, 1))


def _grid(num_columns: int = 2) -> Table:
    table = Table.grid(expand=True, padding=(0, 1))
    table.add_column(no_wrap=True, overflow="ellipsis", style="dim")
    for _ in range(num_columns - 1):
        table.add_column(no_wrap=True, overflow="ellipsis", justify="right")
    return table


def render_requests_panel(view: DashboardView) -> Panel:
    metrics = view.snapshot.metrics
    table = _grid()
    if metrics is None:
        table.add_row("requests", NOT_AVAILABLE)
        return _panel(table, "Requests")
    table.add_row("running", str(metrics.num_running))
    table.add_row("waiting", str(metrics.num_waiting))
    reasons = " ".join(f"{k}:{v}" for k, v in sorted(metrics.num_finished_by_reason.items()))
    table.add_row("finished", f"{metrics.num_finished}" + (f" ({reasons})" if reasons else ""))
    table.add_row("preempted", str(metrics.num_preemptions))
    return _panel(table, "Requests")


class _RateLine:
    """``label  value tok/s  ▁▂▃…`` with the sparkline filling whatever width is left."""

    def __init__(self, label: str, value: float | None, history: Sequence[float]) -> None:
        self.label = label
        self.value = value
        self.history = history

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        head = f"{self.label:<6} {format_rate(self.value):>7} tok/s "
        width = max(0, options.max_width - len(head))
        line = Text(head, no_wrap=True, overflow="ellipsis")
        line.append(sparkline(self.history, width), style="cyan")
        line.truncate(options.max_width, overflow="ellipsis")
        yield line


def render_throughput_panel(view: DashboardView) -> Panel:
    latest = view.rates[-1] if view.rates else None
    body = Group(
        _RateLine(
            "prompt",
            latest.prompt_tokens_per_s if latest else None,
            [r.prompt_tokens_per_s for r in view.rates],
        ),
        _RateLine(
            "gen",
            latest.generation_tokens_per_s if latest else None,
            [r.generation_tokens_per_s for r in view.rates],
        ),
        Text("last minute", style="dim", no_wrap=True, overflow="ellipsis"),
        *_drafts_line(view),
    )
    return _panel(body, "Throughput")


def _drafts_line(view: DashboardView) -> list[Text]:
    """How many speculative tokens were kept: only a server that drafts shows the line."""
    metrics = view.snapshot.metrics
    rate = None if metrics is None else metrics.draft_acceptance_rate
    if metrics is None or rate is None:
        return []
    line = f"drafts kept {format_percent(rate)} of {metrics.num_draft_tokens}"
    return [Text(line, no_wrap=True, overflow="ellipsis")]


def render_latency_panel(view: DashboardView) -> Panel:
    metrics = view.snapshot.metrics
    table = _grid(3)
    table.add_row("", "p50", "p90")
    for name, buckets in (
        ("TTFT", metrics.ttft if metrics else None),
        ("TPOT", metrics.tpot if metrics else None),
    ):
        if buckets is None:
            table.add_row(name, NOT_AVAILABLE, NOT_AVAILABLE)
        else:
            table.add_row(
                name,
                format_seconds(buckets.quantile(0.5)),
                format_seconds(buckets.quantile(0.9)),
            )
    return _panel(table, "Latency (since start)")


def render_kv_panel(view: DashboardView) -> Panel:
    metrics = view.snapshot.metrics
    info = view.snapshot.server
    if metrics is None:
        return _panel(Text(NOT_AVAILABLE), "KV cache")
    bar = Table.grid(expand=True, padding=(0, 1))
    bar.add_column(ratio=1)
    bar.add_column(no_wrap=True, justify="right")
    bar.add_row(
        ProgressBar(total=1.0, completed=metrics.kv_usage, complete_style="cyan"),
        format_percent(metrics.kv_usage),
    )
    table = _grid()
    if info is not None:
        used = round(metrics.kv_usage * info.num_kv_blocks)
        table.add_row("blocks", f"{used} / {info.num_kv_blocks} × {info.block_size} tok")
    else:
        table.add_row("blocks", NOT_AVAILABLE)
    hit_rate = metrics.prefix_hit_rate
    caching = info is not None and not info.is_prefix_caching
    table.add_row("prefix hits", "off" if caching else format_percent(hit_rate))
    return _panel(Group(bar, table), "KV cache")


def render_memory_panel(view: DashboardView) -> Panel:
    memory = view.snapshot.memory
    if memory is None:
        return _panel(Text(f"{NOT_AVAILABLE} (the server has no /memory)"), "Memory")
    table = Table(expand=True, box=None, padding=(0, 1), header_style="dim")
    table.add_column("owner", no_wrap=True, overflow="ellipsis", ratio=1)
    table.add_column("plan", no_wrap=True, justify="right")
    table.add_column("ledger", no_wrap=True, justify="right")
    owners = list(dict.fromkeys([*memory.plan_by_owner, *memory.ledger_by_owner]))
    for owner in owners:
        table.add_row(
            owner,
            format_bytes(memory.plan_by_owner.get(owner)),
            format_bytes(memory.ledger_by_owner.get(owner)),
        )
    table.add_row(
        "total",
        format_bytes(sum(memory.plan_by_owner.values())),
        format_bytes(memory.ledger_live_bytes),
        style="bold",
    )
    budget = Text(
        f"budget {format_bytes(memory.budget_bytes)} on {memory.device}"
        f" · process RSS (anon) {format_bytes(memory.rss_anon_bytes)}"
        f" · host available fell {format_bytes(memory.mem_available_drop_bytes)}",
        style="dim",
        no_wrap=True,
        overflow="ellipsis",
    )
    return _panel(Group(table, budget), "Memory by owner")


def render_recent_requests_panel(view: DashboardView, max_rows: int | None = None) -> Panel:
    rows: Sequence[FinishedRequest] = view.snapshot.recent_requests
    if max_rows is not None:
        rows = rows[:max_rows]
    table = Table(expand=True, box=None, padding=(0, 1), header_style="dim")
    table.add_column("id", no_wrap=True, overflow="ellipsis", ratio=1)
    table.add_column("in", no_wrap=True, justify="right")
    table.add_column("out", no_wrap=True, justify="right")
    table.add_column("latency", no_wrap=True, justify="right")
    table.add_column("finish", no_wrap=True, overflow="ellipsis")
    for request in rows:
        table.add_row(
            request.request_id,
            str(request.num_prompt_tokens),
            str(request.num_completion_tokens),
            format_seconds(request.latency_s),
            request.finish_reason,
        )
    if not rows:
        table.add_row("(none yet)", "", "", "", "")
    return _panel(table, "Last requests")


def render_log_panel(view: DashboardView, max_lines: int) -> Panel:
    lines = view.log_lines[-max_lines:] if max_lines > 0 else ()
    body = Group(*(Text(line, no_wrap=True, overflow="ellipsis") for line in lines))
    return _panel(body, "Log")


def render_loading_panel(view: DashboardView) -> Panel:
    elapsed = view.loading_s
    bar = Table.grid(expand=True, padding=(0, 1))
    bar.add_column(no_wrap=True)
    bar.add_column(ratio=1)
    bar.add_column(no_wrap=True, justify="right")
    progress = view.snapshot.loading_progress
    seconds = f"{elapsed:.0f} s" if elapsed is not None else ""
    if progress is None:
        # No count from /health yet: the bar pulses until the loader reports.
        bar.add_row(
            "weights",
            ProgressBar(total=None, pulse=True, animation_time=elapsed),
            seconds,
        )
    else:
        done, total = progress
        bar.add_row(
            "weights",
            ProgressBar(total=total, completed=done),
            f"{done}/{total} tensors {seconds}".rstrip(),
        )
    note = Text(
        "/health answers 503 until the model is loaded",
        style="dim",
        no_wrap=True,
        overflow="ellipsis",
    )
    return _panel(Group(bar, note), "Loading")


def render_help_panel() -> Panel:
    table = Table.grid(expand=True, padding=(0, 1))
    table.add_column(no_wrap=True, style="bold")
    table.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    for key, meaning in HELP_LINES:
        table.add_row(key, meaning)
    return _panel(table, "Help")
