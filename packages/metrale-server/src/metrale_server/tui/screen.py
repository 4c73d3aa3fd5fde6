"""``render_screen``: the whole dashboard for a terminal of a given size.

Layout, top to bottom: the two-line header, the page body, a one-line footer of keys and
pages. At 80×24 the overview fits requests, throughput, latency and KV panels plus the last
requests and the log; taller terminals give the extra rows to the log.
"""

from __future__ import annotations

from rich.layout import Layout
from rich.text import Text

from metrale_server.tui.header import HEADER_HEIGHT, render_header
from metrale_server.tui.panels import (
    HELP_LINES,
    render_help_panel,
    render_kv_panel,
    render_latency_panel,
    render_loading_panel,
    render_log_panel,
    render_memory_panel,
    render_recent_requests_panel,
    render_requests_panel,
    render_throughput_panel,
)
from metrale_server.tui.snapshot import Status
from metrale_server.tui.view import DashboardView, Page

STAT_ROW_HEIGHT = 6
PANEL_CHROME_LINES = 2


def render_screen(view: DashboardView, height: int) -> Layout:
    """A ``Layout`` meant to be drawn ``height`` lines tall, at any width of 80 or more."""
    root = Layout(name="root")
    body = Layout(name="body")
    root.split_column(
        Layout(render_header(view), name="header", size=HEADER_HEIGHT),
        body,
        Layout(render_footer(view), name="footer", size=1),
    )
    body_height = max(1, height - HEADER_HEIGHT - 1)
    if view.is_help_shown:
        body.split_column(
            Layout(render_help_panel(), size=len(HELP_LINES) + PANEL_CHROME_LINES),
            Layout(render_log_panel(view, body_height), name="log"),
        )
    elif view.snapshot.status is Status.LOADING:
        body.split_column(
            Layout(render_loading_panel(view), size=4),
            Layout(render_log_panel(view, body_height - 4 - PANEL_CHROME_LINES)),
        )
    elif view.page is Page.OVERVIEW:
        _overview(body, view, body_height)
    elif view.page is Page.REQUESTS:
        body.update(render_recent_requests_panel(view, max_rows=body_height))
    elif view.page is Page.MEMORY:
        body.update(render_memory_panel(view))
    else:
        body.update(render_log_panel(view, body_height - PANEL_CHROME_LINES))
    return root


def _overview(body: Layout, view: DashboardView, body_height: int) -> None:
    stats_top = Layout(size=STAT_ROW_HEIGHT)
    stats_top.split_row(Layout(render_requests_panel(view)), Layout(render_throughput_panel(view)))
    stats_bottom = Layout(size=STAT_ROW_HEIGHT)
    stats_bottom.split_row(Layout(render_latency_panel(view)), Layout(render_kv_panel(view)))
    rest = max(0, body_height - 2 * STAT_ROW_HEIGHT)
    num_recent_rows = max(0, rest - PANEL_CHROME_LINES - 1)  # minus the column header
    bottom = Layout(size=rest)
    bottom.split_row(
        Layout(render_recent_requests_panel(view, max_rows=num_recent_rows)),
        Layout(render_log_panel(view, rest - PANEL_CHROME_LINES)),
    )
    body.split_column(stats_top, stats_bottom, bottom)


def render_footer(view: DashboardView) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    if view.is_quitting:
        text.append(" draining, then quitting… ", style="bold magenta")
    else:
        text.append(" q", style="bold")
        text.append(" quit  ")
        text.append("tab", style="bold")
        text.append(" panels  ")
        text.append("?", style="bold")
        text.append(" help ")
    for page in Page:
        style = "reverse bold" if page is view.page else "dim"
        text.append(" ")
        text.append(f" {page.value} ", style=style)
    return text
