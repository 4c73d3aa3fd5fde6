from __future__ import annotations

from metrale_server.tui.keys import Action, actions_for
from metrale_server.tui.view import Page


def test_keys_map_to_actions_in_order() -> None:
    assert actions_for("\t?xq") == [Action.NEXT_PAGE, Action.TOGGLE_HELP, Action.QUIT]
    assert actions_for("Q") == [Action.QUIT]
    assert actions_for("\x1b[A") == [Action.CLOSE_HELP]  # an arrow key only closes help
    assert actions_for("abc") == []


def test_tab_cycles_every_page() -> None:
    page = Page.OVERVIEW
    seen = []
    for _ in Page:
        seen.append(page)
        page = page.next()
    assert seen == list(Page)
    assert page is Page.OVERVIEW
