"""The web UI's routes over plain HTTP (no browser): the pages and their files, their headers,
``--no-webui``, and which routes ``--api-key`` guards."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from metrale_server.webui.pages import is_webui_path, static_files

from .conftest import API_KEY, serve

PAGES = ("/", "/dashboard")
CONTENT_TYPES = {
    "chat.js": "text/javascript; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "common.js": "text/javascript; charset=utf-8",
    "markdown.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
    "chat.html": "text/html; charset=utf-8",
}


def csp_directives(response: httpx.Response) -> dict[str, str]:
    policy = response.headers["content-security-policy"]
    directives = (part.strip().partition(" ") for part in policy.split(";") if part.strip())
    return {name: value for name, _, value in directives}


@pytest.mark.parametrize("path", PAGES)
def test_pages_are_served_with_a_strict_csp(webui_server: Any, path: str) -> None:
    response = httpx.get(f"{webui_server.base_url}{path}")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    csp = csp_directives(response)
    assert csp["default-src"] == "'self'"
    assert csp["script-src"] == "'self'"
    assert csp["connect-src"] == "'self'"
    assert csp["frame-ancestors"] == "'none'"
    assert "unsafe" not in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"
    html = response.text
    # No inline script or style, no absolute URL: everything is a file of this server.
    for script in re.findall(r"<script\b[^>]*>[\s\S]*?</script>", html):
        assert re.search(r'\bsrc="webui/[\w.]+"', script), script
        assert script.endswith("></script>"), script
    assert "<style" not in html
    assert not re.search(r"\sstyle=", html)
    assert not re.search(r'(src|href)="(https?:)?//', html)
    # Every file the page names is served, relative to the page.
    for name in re.findall(r'(?:src|href)="webui/([\w.]+)"', html):
        assert httpx.get(f"{webui_server.base_url}/webui/{name}").status_code == 200, name


def test_static_files_have_their_content_types(webui_server: Any) -> None:
    for name, content_type in CONTENT_TYPES.items():
        response = httpx.get(f"{webui_server.base_url}/webui/{name}")
        assert response.status_code == 200, name
        assert response.headers["content-type"] == content_type, name
        assert response.headers["x-content-type-options"] == "nosniff"
        assert "default-src 'self'" in response.headers["content-security-policy"]
        etag = response.headers["etag"]
        again = httpx.get(f"{webui_server.base_url}/webui/{name}", headers={"If-None-Match": etag})
        assert again.status_code == 304
        assert again.content == b""
    assert set(CONTENT_TYPES) <= set(static_files())
    missing = httpx.get(f"{webui_server.base_url}/webui/nothing.js")
    assert missing.status_code == 404
    assert httpx.get(f"{webui_server.base_url}/webui/../api/app.py").status_code == 404


def test_the_files_name_no_other_origin() -> None:
    """No CDN, no font service, no analytics: the only absolute URLs in the files are the SVG
    namespace and the pattern the Markdown renderer links http(s) URLs with."""
    for name, file in static_files().items():
        text = file.body.decode()
        urls = set(re.findall(r"https?:[^\s\"'`)]*", text))
        assert urls <= {"http://www.w3.org/2000/svg", "https?:"}, (name, urls)
        assert "innerHTML" not in text, name
        assert "eval(" not in text, name


def test_only_the_pages_and_their_files_are_open() -> None:
    for path in ("/", "/dashboard", "/webui/chat.js", "/webui/missing.js"):
        assert is_webui_path(path), path
    for path in ("/webui/", "/webui/..", "/webui/../v1/models", "/dashboard/", "/v1/models"):
        assert not is_webui_path(path), path


def test_a_page_for_another_host_name_is_refused(webui_server: Any) -> None:
    """A rebound DNS name does not get the page (the Host guard covers it as the API)."""
    response = httpx.get(f"{webui_server.base_url}/", headers={"Host": "evil.example"})
    assert response.status_code == 400


def test_pages_need_no_key_while_the_api_does(keyed_server: Any) -> None:
    base_url = keyed_server.base_url
    for path in (*PAGES, "/webui/chat.js", "/webui/style.css"):
        assert httpx.get(f"{base_url}{path}").status_code == 200, path
    bearer = {"Authorization": f"Bearer {API_KEY}"}
    for path in ("/v1/models", "/v1/server", "/v1/requests/recent", "/metrics", "/memory"):
        assert httpx.get(f"{base_url}{path}").status_code == 401, path
        assert httpx.get(f"{base_url}{path}", headers=bearer).status_code == 200, path
    # What an unknown path under the page prefix gets does not depend on the key.
    assert httpx.get(f"{base_url}/webui/missing.js").status_code == 404
    assert httpx.get(f"{base_url}/elsewhere").status_code == 401


def test_no_webui_turns_both_pages_off(tiny_model_dir: Path, tmp_path: Path) -> None:
    with serve(tiny_model_dir, tmp_path, "--no-webui") as server:
        for path in (*PAGES, "/webui/chat.js"):
            assert httpx.get(f"{server.base_url}{path}").status_code == 404, path
        assert httpx.get(f"{server.base_url}/v1/models").status_code == 200
    assert "the dashboard at /dashboard" not in server.log_text()


def test_the_boot_log_names_the_pages(webui_server: Any) -> None:
    assert "a browser gets the chat here, the dashboard at /dashboard" in webui_server.log_text()
