"""``Dashboard``: poll a server, draw frames, act on keys, until quit or ``stop()``.

Frames are drawn at most ``MAX_FRAMES_PER_S`` times a second, and only when something changed
or once a second for the clock. The server is polled every ``poll_interval_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import attrs
from rich.console import Console
from rich.live import Live

from metrale_server.tui.history import RateHistory
from metrale_server.tui.keys import Action, KeyReader, actions_for
from metrale_server.tui.log_buffer import LogBuffer
from metrale_server.tui.poller import HttpPoller
from metrale_server.tui.screen import render_screen
from metrale_server.tui.snapshot import Snapshot, Status
from metrale_server.tui.view import DashboardView, Page

logger = logging.getLogger("metrale.tui")

MAX_FRAMES_PER_S = 4.0
CLOCK_REDRAW_S = 1.0
DEFAULT_POLL_INTERVAL_S = 1.0


class Dashboard:
    """The live dashboard over one ``HttpPoller``.

    ``on_quit`` runs when ``q`` is pressed: ``met serve`` starts its drain there and keeps
    the dashboard up (``stop()`` ends it); without ``on_quit`` the dashboard ends at once.
    ``is_local``: the server runs in this process, so an address that does not answer means
    it is still starting (before it served) or shutting down (after), not offline.
    """

    def __init__(
        self,
        poller: HttpPoller,
        log_buffer: LogBuffer,
        *,
        console: Console | None = None,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        on_quit: Callable[[], None] | None = None,
        is_local: bool = False,
    ) -> None:
        self.poller = poller
        self.log_buffer = log_buffer
        self.console = Console() if console is None else console
        self.poll_interval_s = poll_interval_s
        self.on_quit = on_quit
        self.is_local = is_local
        self.history = RateHistory()
        self.page = Page.OVERVIEW
        self.is_help_shown = False
        self.is_quitting = False
        self._stop = threading.Event()
        self._started_at = time.time()
        self._loading_since: float | None = None
        self._has_served = False
        self._snapshot = Snapshot(url=poller.url, status=Status.LOADING, taken_at=time.monotonic())

    def stop(self) -> None:
        """End ``run()`` (from any thread) within a frame."""
        self._stop.set()

    def run(self) -> None:
        """Poll and draw until ``q`` (without ``on_quit``) or ``stop()``; restores the
        terminal on the way out."""
        next_poll = 0.0
        last_frame = 0.0
        is_dirty = True
        min_frame_s = 1.0 / MAX_FRAMES_PER_S
        with (
            KeyReader() as keys,
            Live(
                console=self.console,
                screen=True,
                auto_refresh=False,
                redirect_stdout=False,
                redirect_stderr=False,
            ) as live,
        ):
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_poll:
                    self._take(self.poller.poll())
                    next_poll = now + self.poll_interval_s
                    is_dirty = True
                if (is_dirty or now - last_frame >= CLOCK_REDRAW_S) and (
                    now - last_frame >= min_frame_s
                ):
                    live.update(render_screen(self.view(), self.console.height), refresh=True)
                    last_frame = now
                    is_dirty = False
                wait_s = max(0.0, min(next_poll, last_frame + min_frame_s) - time.monotonic())
                for action in actions_for(keys.read(max(wait_s, 0.01))):
                    is_dirty = True
                    self.handle(action)

    def handle(self, action: Action) -> None:
        if action is Action.QUIT:
            if self.on_quit is None:
                self.stop()
            elif not self.is_quitting:
                self.is_quitting = True
                self.on_quit()
        elif action is Action.NEXT_PAGE:
            self.is_help_shown = False
            self.page = self.page.next()
        elif action is Action.TOGGLE_HELP:
            self.is_help_shown = not self.is_help_shown
        elif action is Action.CLOSE_HELP:
            self.is_help_shown = False

    def view(self) -> DashboardView:
        snapshot = self._snapshot
        now = time.time()
        if snapshot.server is not None:
            uptime_s: float | None = now - snapshot.server.started_at
        elif self.is_local:
            uptime_s = now - self._started_at
        else:
            uptime_s = None
        loading_s = None if self._loading_since is None else time.monotonic() - self._loading_since
        return DashboardView(
            snapshot=snapshot,
            rates=self.history.samples,
            log_lines=self.log_buffer.lines(),
            page=self.page,
            is_help_shown=self.is_help_shown,
            uptime_s=uptime_s,
            loading_s=loading_s,
            is_quitting=self.is_quitting,
        )

    def _take(self, snapshot: Snapshot) -> None:
        previous = self._snapshot
        if snapshot.status is Status.OFFLINE:
            # Keep showing the last known numbers under the new pill.
            snapshot = attrs.evolve(
                snapshot,
                model=previous.model,
                server=previous.server,
                metrics=previous.metrics,
                memory=previous.memory,
                recent_requests=previous.recent_requests,
                version=previous.version,
            )
            if self.is_local:
                is_ending = self._has_served or self.is_quitting
                status = Status.DRAINING if is_ending else Status.LOADING
                snapshot = attrs.evolve(snapshot, status=status, error=None)
        if snapshot.status is Status.SERVING:
            self._has_served = True
        if snapshot.status is Status.LOADING:
            if self._loading_since is None:
                self._loading_since = time.monotonic()
        else:
            self._loading_since = None
        if snapshot.status is not previous.status:
            logger.info("%s: %s", snapshot.url, snapshot.status.value)
        if snapshot.error and snapshot.error != previous.error:
            logger.warning("%s", snapshot.error)
        if snapshot.metrics is not None and snapshot.metrics is not previous.metrics:
            self.history.add(snapshot.taken_at, snapshot.metrics)
        self._snapshot = snapshot
