"""The header: wordmark, status pill, uptime, version, then the chips of the engine's shape."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from metrale_server.tui.formatting import format_uptime
from metrale_server.tui.snapshot import Status
from metrale_server.tui.view import DashboardView

HEADER_HEIGHT = 2
PILL_STYLES = {
    Status.LOADING: "bold black on yellow",
    Status.SERVING: "bold black on green",
    Status.DRAINING: "bold black on magenta",
    Status.FAULTED: "bold white on red",
    Status.OFFLINE: "bold white on grey37",
}


def render_pill(status: Status) -> Text:
    return Text(f" {status.value} ", style=PILL_STYLES[status])


def render_header(view: DashboardView) -> RenderableType:
    """Two lines; anything too long for the width ends in an ellipsis, never wraps."""
    snapshot = view.snapshot
    top = Table.grid(expand=True, padding=(0, 1))
    top.add_column(no_wrap=True)
    top.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    top.add_column(no_wrap=True, justify="right")
    left = Text.assemble(("metrale ", "bold cyan"), render_pill(snapshot.status))
    middle = Text(f"up {format_uptime(view.uptime_s)}", no_wrap=True, overflow="ellipsis")
    right = Text(f"v{snapshot.version}" if snapshot.version else "", style="dim")
    top.add_row(left, middle, right)
    return Group(top, render_chips(view))


def render_chips(view: DashboardView) -> Text:
    snapshot = view.snapshot
    info = snapshot.server
    chips: list[str] = []
    model = info.model if info else snapshot.model
    if model:
        chips.append(model)
    if info is not None:
        chips += [
            info.dtype,
            info.device,
            f"kv {info.num_kv_blocks}×{info.block_size}",
            f"batch {info.max_batch_size}",
            f"ctx {info.max_seq_len}",
        ]
    chips.append(_address(snapshot.url))
    text = Text(no_wrap=True, overflow="ellipsis")
    for index, chip in enumerate(chips):
        if index:
            text.append(" ")
        text.append(f" {chip} ", style="black on grey70")
    return text


def _address(url: str) -> str:
    return url.removeprefix("http://").removeprefix("https://")
