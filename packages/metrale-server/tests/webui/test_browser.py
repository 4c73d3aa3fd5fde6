"""The web UI in a real headless Chromium (Playwright) against a real ``met serve``: a streamed
reply, stop, a JSON-schema reply, a reload, the dashboard under load, the key prompt; every
request the pages make goes to the server's own origin, and no CSP violation or script error
happens on the way."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import pytest
from metrale_testing import served
from PIL import Image

from .conftest import API_KEY, MODEL_NAME, SERVE_FLAGS, metric

# Records every state of the newest reply's text, as the DOM changes.
WATCH_REPLY = """() => {
  window.replyStates = [];
  new MutationObserver(() => {
    const replies = document.querySelectorAll(".message.assistant .content");
    const text = replies.length ? replies[replies.length - 1].textContent : "";
    if (window.replyStates.at(-1) !== text) window.replyStates.push(text);
  }).observe(document.getElementById("messages"), {
    childList: true, subtree: true, characterData: true,
  });
}"""
# Generous: the tests share a 2-core machine with whatever else runs there.
TIMEOUT_S = 45
# tokens/s only where the tokens came apart in time (a short reply may arrive in one read).
STATS = re.compile(r"^\d+ tokens( · [\d.,]+ tok/s)? · TTFT \d+ ms · \w+$")


class Tab:
    """A page of a fresh browser context (its own storage) on ``base_url``, recording every
    request it makes and every script error or CSP violation it meets."""

    def __init__(self, browser: Any, base_url: str, **context: Any) -> None:
        self.base_url = base_url
        context.setdefault("viewport", {"width": 1100, "height": 760})
        self.context = browser.new_context(**context)
        self.requests: list[str] = []
        self.problems: list[str] = []
        self.context.on("request", lambda request: self.requests.append(request.url))
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_S * 1000)
        self.page.on("pageerror", lambda error: self.problems.append(f"script error: {error}"))
        self.page.on("console", self._on_console)

    def _on_console(self, message: Any) -> None:
        if "Content Security Policy" in message.text or "Trusted Type" in message.text:
            self.problems.append(f"CSP: {message.text}")

    def open(self, path: str = "/") -> Any:
        self.page.goto(f"{self.base_url}{path}")
        if path == "/":
            self.page.wait_for_selector("body[data-ready=true]")
        return self.page

    def settings(self, **values: str) -> None:
        page = self.page
        page.click("#toggle-settings")
        for name, value in values.items():
            page.fill(f"#{name}", value)
        page.click("#toggle-settings")

    def send(self, text: str) -> None:
        self.page.fill("#prompt", text)
        self.page.press("#prompt", "Enter")

    def wait_reply_done(self) -> str:
        """The finished reply's stats line."""
        page = self.page
        page.wait_for_selector("#send:visible")
        page.wait_for_selector(".message.assistant:last-child .stats:not(:empty)")
        stats: str = page.inner_text(".message.assistant:last-child .stats")
        return stats

    def check_origin(self) -> None:
        assert self.requests
        foreign = [url for url in self.requests if not url.startswith(f"{self.base_url}/")]
        assert not foreign, foreign
        assert not self.problems, self.problems

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(browser: Any, webui_server: Any) -> Iterator[Tab]:
    opened = Tab(browser, webui_server.base_url)
    yield opened
    opened.check_origin()
    opened.close()


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_js(page: Any, expression: str, timeout_s: float = TIMEOUT_S) -> None:
    """Until ``expression`` is true in the page. (Playwright's ``wait_for_function`` evaluates
    its predicate with ``eval``, which the pages' CSP refuses; ``evaluate`` goes through the
    debugger protocol.)"""
    wait_for(lambda: bool(page.evaluate(expression)), timeout_s, expression)


def test_a_reply_streams_into_the_page_in_pieces(tab: Tab, screenshot_dir: Path) -> None:
    page = tab.open()
    # Long enough to be caught mid-reply on an idle machine too; stopped once seen.
    tab.settings(max_tokens="300", seed="7", system="You are terse.")
    page.evaluate(WATCH_REPLY)
    tab.send("Write a **haiku** about paged KV caches.")
    # Mid-reply (the settings open beside it, for the screenshot): text growing, stop up.
    page.click("#toggle-settings")
    wait_js(page, "window.replyStates.filter((s) => s.length > 0).length >= 3")
    wait_js(page, "window.replyStates.some((s) => s.length > 80)")
    assert page.is_visible("#stop")
    page.screenshot(path=str(screenshot_dir / "webui-chat.png"))
    states: list[str] = page.evaluate("window.replyStates")
    page.click("#stop")
    stats = tab.wait_reply_done()
    assert STATS.match(stats), stats
    assert stats.endswith("stopped")
    assert " tok/s · " in stats
    final = page.inner_text(".message.assistant:last-child .content")
    growing = [s for s in states if 0 < len(s) < len(final.replace("\n", ""))]
    assert len(set(growing)) >= 2, states
    assert page.inner_text(".message.user .content") == "Write a **haiku** about paged KV caches."
    assert page.is_visible(".message.assistant:last-child button.regenerate")


def test_stop_aborts_the_request_on_the_server(tab: Tab, webui_server: Any) -> None:
    base_url = webui_server.base_url
    in_flight = ("metrale_num_requests_running", "metrale_num_requests_waiting")
    generated_before = metric(base_url, "metrale_generation_tokens_total")
    page = tab.open()
    tab.settings(max_tokens="400")
    tab.send("Count to a thousand.")
    wait_js(page, "document.querySelector('.message.assistant .content')?.textContent.length > 0")
    page.click("#stop")
    stats = tab.wait_reply_done()
    assert "stopped" in stats
    # An abort is immediate; a request left running would take seconds more to finish.
    wait_for(lambda: metric(base_url, *in_flight) == 0, 10, "no request running")
    generated = metric(base_url, "metrale_generation_tokens_total") - generated_before
    assert 0 < generated < 400
    # Regenerate asks again, and the new reply replaces the stopped one.
    tab.settings(max_tokens="4")
    page.click("button.regenerate")
    assert tab.wait_reply_done().startswith("4 tokens")
    assert page.locator(".message.assistant").count() == 1


def test_a_json_schema_reply_parses(tab: Tab) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    page = tab.open()
    tab.settings(max_tokens="60", temperature="0", json_schema=json.dumps(schema))
    tab.send("Is the cache warm?")
    stats = tab.wait_reply_done()
    assert stats.endswith("stop"), stats
    reply = json.loads(page.inner_text(".message.assistant .json-reply"))
    jsonschema.validate(reply, schema)


def test_a_tool_call_is_shown(tab: Tab) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    page = tab.open()
    tab.settings(max_tokens="60", temperature="0", tools=json.dumps([tool]))
    page.click("#toggle-settings")
    page.select_option("#tool_choice", "required")
    page.click("#toggle-settings")
    tab.send("What is the weather?")
    stats = tab.wait_reply_done()
    assert stats.endswith("tool_calls"), stats
    assert page.inner_text(".tool-call summary code") == "get_weather"
    arguments = json.loads(page.inner_text(".tool-call pre"))
    assert arguments["city"] in {"Paris", "Oslo"}


def sse(*chunks: dict[str, Any]) -> str:
    frames = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
    return "".join(frames) + "data: [DONE]\n\n"


def test_reasoning_is_shown_folded(tab: Tab) -> None:
    """The tiny random model never reasons: this reply's stream is canned (the page's request is
    answered in the browser), to see how the page shows ``reasoning_content``."""

    def delta(**fields: Any) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}

    body = sse(
        delta(role="assistant", content=""),
        delta(reasoning_content="The user greets; "),
        delta(reasoning_content="answer briefly."),
        delta(content="Hello **there**."),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}},
    )
    page = tab.open()
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(status=200, content_type="text/event-stream", body=body),
    )
    tab.send("hi")
    assert tab.wait_reply_done().startswith("9 tokens")
    reasoning = page.locator(".message.assistant .reasoning")
    assert reasoning.is_visible()
    assert reasoning.get_attribute("open") is None
    body_text = ".message.assistant .reasoning-body"
    assert not page.is_visible(body_text)
    page.click(".message.assistant .reasoning summary")
    assert page.inner_text(body_text) == "The user greets; answer briefly."
    assert page.inner_text(".message.assistant .content strong") == "there"


MARKDOWN = """# Title
Some **bold**, *em*, `code`, [a link](https://example.com/x) and [no](javascript:alert(1)).
<img src=x onerror="window.pwned = 1"><script>window.pwned = 2</script>

```python
print("<b>hi</b>")
```

- one
- two

| a | b |
|---|--:|
| 1 | 2 |
"""


def test_markdown_is_rendered_and_markup_stays_text(tab: Tab) -> None:
    page = tab.open()
    rendered = page.evaluate(
        """async (text) => {
          const { renderMarkdown } = await import("./webui/markdown.js");
          const box = document.createElement("div");
          box.append(renderMarkdown(text));
          document.body.append(box);
          const all = (selector) => [...box.querySelectorAll(selector)];
          return {
            heading: all("h3").map((n) => n.textContent),
            strong: all("strong").map((n) => n.textContent),
            em: all("em").map((n) => n.textContent),
            code: all("p code").map((n) => n.textContent),
            links: all("a").map((n) => n.getAttribute("href")),
            block: all("pre code").map((n) => [n.dataset.language, n.textContent]),
            items: all("li").map((n) => n.textContent),
            cells: all("td").map((n) => [n.textContent, n.className]),
            markup: all("img, script, b").length,
            text: box.textContent,
            pwned: window.pwned === undefined ? null : window.pwned,
          };
        }""",
        MARKDOWN,
    )
    assert rendered["heading"] == ["Title"]
    assert rendered["strong"] == ["bold"]
    assert rendered["em"] == ["em"]
    assert rendered["code"] == ["code"]
    assert rendered["links"] == ["https://example.com/x"]
    assert rendered["block"] == [["python", 'print("<b>hi</b>")']]
    assert rendered["items"] == ["one", "two"]
    assert rendered["cells"] == [["1", ""], ["2", "align-right"]]
    assert rendered["markup"] == 0
    assert "<script>window.pwned = 2</script>" in rendered["text"]
    assert "[no](javascript:alert(1))" in rendered["text"]
    assert rendered["pwned"] is None


def test_a_reload_keeps_the_conversation(tab: Tab) -> None:
    page = tab.open()
    tab.settings(max_tokens="6")
    tab.send("first question")
    stats = tab.wait_reply_done()
    assert STATS.match(stats), stats
    assert stats.startswith("6 tokens")
    before = page.inner_text("#messages")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert page.inner_text("#messages") == before
    assert page.locator(".message").count() == 2
    assert page.inner_text("#conversations") == "first question\n×"
    assert page.input_value("#max_tokens") == "6"


def test_the_page_reads_on_a_phone_in_the_dark(
    browser: Any, webui_server: Any, screenshot_dir: Path
) -> None:
    phone = Tab(
        browser,
        webui_server.base_url,
        viewport={"width": 375, "height": 740},
        color_scheme="dark",
        is_mobile=True,
    )
    try:
        page = phone.open()
        assert page.evaluate("document.documentElement.scrollWidth") <= 375
        # Shift+Enter starts a new line; nothing is sent.
        page.fill("#prompt", "line one")
        page.press("#prompt", "Shift+Enter")
        page.type("#prompt", "line two")
        assert page.input_value("#prompt") == "line one\nline two"
        assert page.locator(".message").count() == 0
        assert page.is_visible("#toggle-sidebar")
        # The conversations slide in over the chat on a tap, and are off the screen before.
        sidebar_right = "document.getElementById('sidebar').getBoundingClientRect().right"
        assert page.evaluate(sidebar_right) <= 0
        page.click("#toggle-sidebar")
        wait_js(page, f"{sidebar_right} > 200")
        page.screenshot(path=str(screenshot_dir / "webui-phone-dark.png"))
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(21, 23, 26)", background
        phone.check_origin()
    finally:
        phone.close()


@pytest.fixture
def load(webui_server: Any) -> Iterator[threading.Event]:
    """Four streams of completions against the server until the test ends (httpx on threads,
    in place of ``met bench serve``: the same requests, no second process)."""
    stop = threading.Event()
    body = {"prompt": "load", "max_tokens": 16, "ignore_eos": True, "model": MODEL_NAME}

    def client() -> None:
        with httpx.Client(base_url=webui_server.base_url, timeout=60) as http:
            while not stop.is_set():
                http.post("/v1/completions", json=body).raise_for_status()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    yield stop
    stop.set()
    for thread in threads:
        thread.join(60)


def chart(page: Any, name: str, field: str) -> list[float | None]:
    value: list[float | None] = json.loads(
        page.get_attribute(f"#chart-{name}", f"data-{field}") or "[]"
    )
    return value


def test_the_dashboard_moves_under_load(
    tab: Tab, load: threading.Event, screenshot_dir: Path
) -> None:
    page = tab.open("/dashboard")
    page.wait_for_selector("#status[data-state=live]")

    def latest(name: str) -> float:
        return chart(page, name, "latest")[0] or 0.0

    wait_for(lambda: latest("throughput") > 0, TIMEOUT_S, "output tokens/s above 0")
    wait_for(lambda: (chart(page, "requests", "max")[0] or 0) >= 1, TIMEOUT_S, "a running request")
    wait_for(lambda: latest("latency") > 0, TIMEOUT_S, "a TTFT p50")
    # Some seconds of load drawn, and the load's own requests listed (for the screenshot).
    points = "#chart-throughput .line"
    wait_for(
        lambda: len((page.get_attribute(points, "points") or "").split()) > 6, TIMEOUT_S, "points"
    )
    page.wait_for_selector("#recent tbody code:text-matches('^cmpl-')")
    first = page.get_attribute(points, "points")
    wait_for(lambda: page.get_attribute(points, "points") != first, 10, "the chart to move")
    page.wait_for_selector(".memory-bar .segment[data-owner=kv_pool]")
    assert page.inner_text("[data-fact=model]") == MODEL_NAME
    assert page.inner_text("[data-fact=device]") == "cpu"
    assert page.inner_text("[data-fact='compile state']") in {"eager", "native"}
    page.screenshot(path=str(screenshot_dir / "webui-dashboard.png"), full_page=True)
    recent = page.inner_text("#recent")
    assert "load" not in recent.split("finished", 1)[1]  # ids and counts, never text
    assert chart(page, "kv", "latest")[0] is not None


def test_the_key_is_asked_once_and_kept_in_the_tab(browser: Any, keyed_server: Any) -> None:
    keyed = Tab(browser, keyed_server.base_url)
    try:
        page = keyed.page
        page.goto(f"{keyed_server.base_url}/")
        page.wait_for_selector("#key-dialog[open]")
        page.fill("#key-input", "not-the-key")
        page.click("#key-submit")
        page.wait_for_selector("#key-error:has-text('refused')")
        page.fill("#key-input", API_KEY)
        page.click("#key-submit")
        page.wait_for_selector("body[data-ready=true]")
        assert not page.is_visible("#key-dialog")
        assert page.inner_text("#model-name") == MODEL_NAME
        keyed.settings(max_tokens="4")
        keyed.send("hello")
        assert keyed.wait_reply_done().startswith("4 tokens")
        # Kept for the tab (a reload asks nothing), never in the browser's lasting storage.
        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        page.goto(f"{keyed_server.base_url}/dashboard")
        page.wait_for_selector("#status[data-state=live]")
        page.wait_for_selector(".memory-bar .segment[data-owner=kv_pool]")
        wait_for(lambda: chart(page, "requests", "latest") == [0, 0], TIMEOUT_S, "/metrics read")
        assert not page.is_visible("#key-dialog")
        assert page.evaluate("sessionStorage.getItem('metrale.apiKey')") == API_KEY
        assert API_KEY not in page.evaluate("JSON.stringify(localStorage)")
        other_tab = keyed.context.new_page()
        other_tab.goto(f"{keyed_server.base_url}/")
        other_tab.wait_for_selector("#key-dialog[open]")
        keyed.check_origin()
    finally:
        keyed.close()


@pytest.fixture(scope="module")
def vision_server(tiny_glm5_vision_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    with served(
        [str(tiny_glm5_vision_dir), *SERVE_FLAGS, "--max-seq-len", "512"],
        tmp_path_factory.mktemp("webui-vision"),
    ) as server:
        yield server


def test_an_attached_image_goes_with_the_message(
    browser: Any, vision_server: Any, webui_server: Any, tmp_path: Path
) -> None:
    image = tmp_path / "photo.png"
    Image.fromarray(np.full((20, 28, 3), 90, dtype=np.uint8)).save(image)
    encoded_before = metric(vision_server.base_url, "metrale_mm_images_encoded_total")
    tab = Tab(browser, vision_server.base_url)
    page = tab.open()
    assert page.is_visible("#attach-button")
    page.set_input_files("#attach", str(image))
    page.wait_for_selector("#attachments .thumb")
    tab.settings(max_tokens="4", temperature="0")
    tab.send("What is in the picture?")
    assert tab.wait_reply_done().startswith("4 tokens")
    # The message shows its image, the composer none left, and the server encoded it.
    assert page.locator(".message.user .thumb").count() == 1
    assert page.is_hidden("#attachments")
    assert metric(vision_server.base_url, "metrale_mm_images_encoded_total") == encoded_before + 1
    tab.check_origin()
    tab.close()
    # A model without images offers no attachment.
    text_only = Tab(browser, webui_server.base_url)
    assert text_only.open().is_hidden("#attach-button")
    text_only.close()
