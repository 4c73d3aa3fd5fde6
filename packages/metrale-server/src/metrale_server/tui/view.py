"""``DashboardView``: everything one frame draws; the render functions read only this."""

from __future__ import annotations

import enum

import attrs

from metrale_server.tui.history import RateSample
from metrale_server.tui.snapshot import Snapshot


class Page(enum.Enum):
    """What the body shows; ``tab`` cycles through them in this order."""

    OVERVIEW = "Overview"
    REQUESTS = "Requests"
    MEMORY = "Memory"
    LOG = "Log"

    def next(self) -> Page:
        pages = list(Page)
        return pages[(pages.index(self) + 1) % len(pages)]


@attrs.frozen(kw_only=True)
class DashboardView:
    """One frame's input. ``uptime_s`` is ``None`` when unknown; ``loading_s`` is how long the
    dashboard has watched the server load; ``log_lines`` are oldest first."""

    snapshot: Snapshot
    rates: tuple[RateSample, ...] = ()
    log_lines: tuple[str, ...] = ()
    page: Page = Page.OVERVIEW
    is_help_shown: bool = False
    uptime_s: float | None = None
    loading_s: float | None = None
    is_quitting: bool = False
