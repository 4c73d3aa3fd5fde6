"""The terminal dashboard of ``met serve`` and ``met top``, and the ``met chat`` backends.

Data flows one way: ``HttpPoller`` reads a server into a ``Snapshot``; ``Dashboard`` keeps the
rate history and key state and builds a ``DashboardView``; ``render_screen`` draws it.
"""

from metrale_server.tui.live_loop import Dashboard
from metrale_server.tui.poller import HttpPoller
from metrale_server.tui.screen import render_screen
from metrale_server.tui.snapshot import Snapshot, Status
from metrale_server.tui.view import DashboardView, Page

__all__ = [
    "Dashboard",
    "DashboardView",
    "HttpPoller",
    "Page",
    "Snapshot",
    "Status",
    "render_screen",
]
