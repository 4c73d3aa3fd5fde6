"""``met top``: the dashboard of ``met serve``, attached to any server through its HTTP API."""

from __future__ import annotations

import logging

import click

from metrale_server.cli.common import CONTEXT
from metrale_server.tui.live_loop import Dashboard
from metrale_server.tui.log_buffer import LogBuffer
from metrale_server.tui.poller import HttpPoller

DEFAULT_URL = "http://127.0.0.1:8888"


def run_top(url: str, *, api_key: str | None = None, poll_interval_s: float = 1.0) -> int:
    """Watch the server at ``url`` until ``q``; returns 0. The log panel shows what the
    dashboard itself saw (status changes, endpoints that failed)."""
    log_buffer = LogBuffer()
    root = logging.getLogger()
    saved = list(root.handlers)
    root.handlers[:] = [log_buffer]
    root.setLevel(logging.INFO)
    logging.getLogger("metrale.tui").info("watching %s", url)
    try:
        Dashboard(
            HttpPoller(url, api_key=api_key), log_buffer, poll_interval_s=poll_interval_s
        ).run()
    finally:
        root.handlers[:] = saved
    return 0


@click.command(context_settings=CONTEXT)
@click.option(
    "--url",
    default="http://127.0.0.1:8888",
    show_default=True,
    help="The server to watch (any metrale server, local or remote).",
)
@click.option("--api-key", default=None, help="Sent as 'Authorization: Bearer KEY'.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.25),
    default=1.0,
    show_default=True,
    help="Seconds between polls of the server.",
)
def top(url: str, api_key: str | None, interval: float) -> None:
    """Watch a running server in a live dashboard (q quits, tab switches panels, ? help)."""
    click.get_current_context().exit(run_top(url, api_key=api_key, poll_interval_s=interval))
