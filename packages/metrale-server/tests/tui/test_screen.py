"""The dashboard drawn from fixed snapshots: content, and no line wider than the terminal."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
from rich.console import Console

from metrale_server.tui.screen import render_screen
from metrale_server.tui.snapshot import Snapshot, Status
from metrale_server.tui.view import DashboardView, Page

ViewFactory = Callable[..., DashboardView]

SIZES = [(80, 24), (100, 30), (160, 50)]


def draw(view: DashboardView, width: int = 80, height: int = 24) -> list[str]:
    console = Console(
        width=width, height=height, record=True, force_terminal=True, color_system=None
    )
    console.print(render_screen(view, height))
    return console.export_text().splitlines()


def assert_fits(lines: list[str], width: int, height: int) -> None:
    assert len(lines) == height
    too_wide = [line for line in lines if len(line) > width]
    assert not too_wide, too_wide


@pytest.mark.parametrize(("width", "height"), SIZES)
@pytest.mark.parametrize("page", list(Page))
@pytest.mark.parametrize("status", [Status.SERVING, Status.LOADING, Status.DRAINING])
def test_every_page_fits_the_terminal(
    width: int, height: int, page: Page, status: Status, make_view: ViewFactory, snapshot: Snapshot
) -> None:
    view = make_view(page=page, snapshot=attrs.evolve(snapshot, status=status), loading_s=2.0)
    assert_fits(draw(view, width, height), width, height)


def test_overview_at_80x24_shows_every_panel(make_view: ViewFactory) -> None:
    text = "\n".join(draw(make_view()))
    assert " SERVING " in text
    assert "up 01:02:05" in text
    assert "v0.1.0" in text
    for chip in ("SmolLM2-135M-Instruct.Q4_1", "float32", "cpu", "kv 512×16", "batch 64"):
        assert chip in text
    for title in ("Requests", "Throughput", "Latency", "KV cache", "Last requests", "Log"):
        assert title in text
    assert "running                            3" in text
    assert "waiting                            2" in text
    assert "6 (length:2 stop:4)" in text
    # TTFT buckets: 2 of 6 under 0.1 s, all 6 under 1 s -> p50 = 0.1 + 0.9 * (3-2)/4 = 325 ms.
    assert "325 ms" in text
    assert "865 ms" in text  # p90: 0.1 + 0.9 * (5.4 - 2) / 4
    assert "25.0%" in text
    assert "128 / 512 × 16 tok" in text
    assert "prefix hits" in text
    assert "25.0%" in text  # 100 of 400 prompt tokens hit
    assert "590 tok/s" in text  # the latest prompt rate


def test_the_chips_line_ends_in_an_ellipsis_when_too_long(make_view: ViewFactory) -> None:
    lines = draw(make_view())
    assert lines[1].rstrip().endswith("…")


def test_requests_page_lists_ids_counts_latency_and_finish_reason(
    make_view: ViewFactory, snapshot: Snapshot
) -> None:
    text = "\n".join(draw(make_view(page=Page.REQUESTS)))
    newest = snapshot.recent_requests[0]
    assert newest.request_id in text
    row = next(line for line in text.splitlines() if newest.request_id in line)
    assert row.split()[2:7] == ["10", "40", "500", "ms", "stop"]


def test_memory_page_shows_plan_and_ledger_by_owner(make_view: ViewFactory) -> None:
    lines = draw(make_view(page=Page.MEMORY))
    weights = next(line for line in lines if "weights" in line)
    assert weights.split()[2:6] == ["1.0", "MiB", "1.0", "MiB"]
    kv = next(line for line in lines if "kv_cache" in line)
    assert kv.split()[2:6] == ["2.0", "MiB", "2.0", "MiB"]
    assert any("budget 1.0 GiB on cpu · process RSS (anon) n/a" in line for line in lines)


def test_memory_page_says_n_a_without_a_memory_route(
    make_view: ViewFactory, snapshot: Snapshot
) -> None:
    view = make_view(page=Page.MEMORY, snapshot=attrs.evolve(snapshot, memory=None))
    text = "\n".join(draw(view))
    assert "n/a" in text
    assert "weights" not in text


def test_panels_say_n_a_before_any_metrics() -> None:
    bare = Snapshot(url="http://10.0.0.1:8888", status=Status.OFFLINE, taken_at=0.0)
    lines = draw(DashboardView(snapshot=bare))
    assert_fits(lines, 80, 24)
    text = "\n".join(lines)
    assert " OFFLINE " in text
    assert "--:--:--" in text
    assert "10.0.0.1:8888" in text
    assert text.count("n/a") >= 4


def test_loading_shows_a_bar_and_the_log(make_view: ViewFactory, snapshot: Snapshot) -> None:
    view = make_view(snapshot=attrs.evolve(snapshot, status=Status.LOADING), loading_s=7.0)
    text = "\n".join(draw(view))
    assert " LOADING " in text
    assert "weights" in text
    assert "7 s" in text
    assert "Log" in text
    assert "Requests" in text  # only in the footer's page list
    assert "Throughput" not in text


def test_loading_with_a_count_shows_the_tensors_loaded(
    make_view: ViewFactory, snapshot: Snapshot
) -> None:
    loading = attrs.evolve(snapshot, status=Status.LOADING, loading_progress=(45, 272))
    lines = draw(make_view(snapshot=loading, loading_s=3.0))
    assert_fits(lines, 80, 24)
    assert "45/272 tensors 3 s" in "\n".join(lines)


def test_help_lists_the_keys(make_view: ViewFactory) -> None:
    text = "\n".join(draw(make_view(is_help_shown=True)))
    assert "q   quit" in text
    assert "tab next panel" in text
    assert "?   show or hide this help" in text


def test_footer_marks_the_page_and_the_drain(make_view: ViewFactory) -> None:
    assert "q quit" in draw(make_view())[-1]
    quitting = draw(make_view(is_quitting=True))[-1]
    assert "draining, then quitting" in quitting


@pytest.mark.parametrize("status", list(Status))
def test_the_pill_names_the_status(
    status: Status, make_view: ViewFactory, snapshot: Snapshot
) -> None:
    view = make_view(snapshot=attrs.evolve(snapshot, status=status))
    assert f" {status.value} " in draw(view)[0]


def test_a_speculating_server_shows_its_drafts_kept(
    make_view: ViewFactory, snapshot: Snapshot
) -> None:
    assert snapshot.metrics is not None
    metrics = attrs.evolve(snapshot.metrics, num_draft_tokens=200, num_accepted_tokens=100)
    view = make_view(snapshot=attrs.evolve(snapshot, metrics=metrics))
    text = "\n".join(draw(view, 100, 40))
    assert "drafts kept" in text
    assert "50.0% of 200" in text
    assert_fits(draw(view), 80, 24)
    assert "drafts kept" not in "\n".join(draw(make_view(), 100, 40))
