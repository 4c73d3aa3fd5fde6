"""``met top``: the dashboard of ``met serve``, attached to any server through its HTTP API.

On a terminal it is the live dashboard until ``q``; when stdout is not a terminal (a pipe, a
file, a CI log), or with ``--once``, it prints one plain-text snapshot and exits, as
``top -b -n 1`` does.
"""

from __future__ import annotations

import logging
import sys

import click

from metrale_server.cli.common import CONTEXT
from metrale_server.cli.top_text import snapshot_lines
from metrale_server.tui.live_loop import Dashboard
from metrale_server.tui.log_buffer import LogBuffer
from metrale_server.tui.poller import HttpPoller
from metrale_server.tui.snapshot import Status

DEFAULT_URL = "http://127.0.0.1:8888"
EXIT_UNREACHABLE = 1


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


def print_snapshot(url: str, *, api_key: str | None = None) -> int:
    """One reading of the server at ``url`` on stdout; 0, or 1 (and why, on stderr) when
    nothing answers there."""
    snapshot = HttpPoller(url, api_key=api_key).poll()
    if snapshot.status is Status.OFFLINE:
        click.echo(f"met top: no server answers at {snapshot.url}: {snapshot.error}", err=True)
        return EXIT_UNREACHABLE
    click.echo("\n".join(snapshot_lines(snapshot)))
    return 0


@click.command(context_settings=CONTEXT)
@click.option(
    "--url",
    default=DEFAULT_URL,
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
@click.option(
    "--once",
    is_flag=True,
    help="Print one plain-text snapshot and exit (what it does when stdout is not a terminal).",
)
def top(url: str, api_key: str | None, interval: float, once: bool) -> None:
    """Watch a running server in a live dashboard (q quits, tab switches panels, ? help).

    When stdout is not a terminal, or with --once, print one plain-text snapshot and exit:
    0, or 1 when no server answers at --url.
    """
    context = click.get_current_context()
    if once or not sys.stdout.isatty():
        context.exit(print_snapshot(url, api_key=api_key))
    context.exit(run_top(url, api_key=api_key, poll_interval_s=interval))
