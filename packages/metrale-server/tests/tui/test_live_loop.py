"""The dashboard loop without a terminal: keys, status mapping, and drawing into a file."""

from __future__ import annotations

import io
import threading

from rich.console import Console

from metrale_server.tui.keys import Action
from metrale_server.tui.live_loop import Dashboard
from metrale_server.tui.log_buffer import LogBuffer
from metrale_server.tui.poller import HttpPoller
from metrale_server.tui.serve_dashboard import is_dashboard_wanted, local_url
from metrale_server.tui.snapshot import Snapshot, Status
from metrale_server.tui.view import Page

CLOSED_URL = "http://127.0.0.1:9"  # discard port: nothing answers


def dashboard(**kwargs: object) -> Dashboard:
    console = Console(file=io.StringIO(), width=80, height=24, force_terminal=True)
    return Dashboard(HttpPoller(CLOSED_URL, timeout_s=0.5), LogBuffer(), console=console, **kwargs)  # type: ignore[arg-type]


def test_keys_switch_pages_toggle_help_and_quit() -> None:
    board = dashboard()
    board.handle(Action.TOGGLE_HELP)
    assert board.view().is_help_shown
    board.handle(Action.NEXT_PAGE)
    assert board.page is Page.REQUESTS
    assert not board.view().is_help_shown
    board.handle(Action.QUIT)
    assert board._stop.is_set()


def test_quit_with_a_drain_hook_calls_it_once_and_keeps_running() -> None:
    calls: list[int] = []
    board = dashboard(on_quit=lambda: calls.append(1))
    board.handle(Action.QUIT)
    board.handle(Action.QUIT)
    assert calls == [1]
    assert board.view().is_quitting
    assert not board._stop.is_set()


def test_a_local_server_that_does_not_answer_is_loading_then_draining() -> None:
    board = dashboard(is_local=True)
    offline = Snapshot(url=CLOSED_URL, status=Status.OFFLINE, taken_at=1.0, error="refused")
    board._take(offline)
    assert board.view().snapshot.status is Status.LOADING
    board._take(Snapshot(url=CLOSED_URL, status=Status.SERVING, taken_at=2.0))
    board._take(offline)
    assert board.view().snapshot.status is Status.DRAINING


def test_a_remote_server_that_does_not_answer_is_offline() -> None:
    board = dashboard()
    board._take(Snapshot(url=CLOSED_URL, status=Status.OFFLINE, taken_at=1.0))
    assert board.view().snapshot.status is Status.OFFLINE
    assert board.view().uptime_s is None


def test_run_draws_frames_until_stopped() -> None:
    board = dashboard(poll_interval_s=0.2)
    thread = threading.Thread(target=board.run)
    thread.start()
    threading.Event().wait(0.8)
    board.stop()
    thread.join(5)
    assert not thread.is_alive()
    drawn = board.console.file.getvalue()  # type: ignore[attr-defined]
    assert "OFFLINE" in drawn
    assert "127.0.0.1:9" in drawn
    assert " Requests " in drawn


def test_the_dashboard_is_off_without_a_terminal_or_when_asked() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    assert is_dashboard_wanted(no_tui=False, environ={}, stdin=tty, stdout=tty)
    assert not is_dashboard_wanted(no_tui=True, environ={}, stdin=tty, stdout=tty)
    env = {"METRALE_NO_TUI": "1"}
    assert not is_dashboard_wanted(no_tui=False, environ=env, stdin=tty, stdout=tty)
    assert not is_dashboard_wanted(no_tui=False, environ={}, stdin=tty, stdout=io.StringIO())


def test_the_local_url_uses_loopback_for_a_wildcard_bind() -> None:
    assert local_url("0.0.0.0", 80) == "http://127.0.0.1:80"
    assert local_url("::", 80) == "http://[::1]:80"
    assert local_url("127.0.0.1", 8888) == "http://127.0.0.1:8888"
