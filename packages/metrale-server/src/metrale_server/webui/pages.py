"""The web UI's routes: its two pages and their static files, under a strict CSP.

The pages hold no data (everything they show comes from the API, with the tab's API key), so
they are served without a key; the Host guard still applies. Every URL in them is relative, so
they work behind TLS and behind a proxy that mounts the server under a path.
"""

from __future__ import annotations

import hashlib
from functools import cache, partial
from importlib import resources

import attrs
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

PAGES = {"/": "chat.html", "/dashboard": "dashboard.html"}
ASSET_PREFIX = "/webui/"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
# No inline script or style, no eval, no request to another origin, no framing; DOM sinks that
# parse HTML from strings are refused too (the pages build nodes, never markup).
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        # data: for the thumbnails of images attached to a message (read from local files).
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
    )
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    # Revalidated on every load (an upgraded server serves its own files), 304 when unchanged.
    "Cache-Control": "no-cache",
}


@attrs.frozen(kw_only=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str


def is_webui_path(path: str) -> bool:
    """Whether ``path`` is one of the web UI's (served without an API key): a page, or a file
    name right under ``/webui/`` (nothing a dot-dot could lead elsewhere from)."""
    name = path.removeprefix(ASSET_PREFIX)
    return path in PAGES or (name != path and "/" not in name and name not in ("", ".", ".."))


@cache
def static_files() -> dict[str, StaticFile]:
    """Every file of ``static/`` by name, read once."""
    files = {}
    for entry in (resources.files(__package__) / "static").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if not entry.is_file() or suffix not in CONTENT_TYPES:
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        files[entry.name] = StaticFile(body=body, content_type=CONTENT_TYPES[suffix], etag=etag)
    return files


def file_response(request: Request, name: str) -> Response:
    file = static_files().get(name)
    if file is None:
        raise HTTPException(404, f"{request.url.path} does not exist")
    headers = {**SECURITY_HEADERS, "ETag": file.etag}
    if request.headers.get("if-none-match") == file.etag:
        return Response(status_code=304, headers=headers)
    return Response(file.body, headers={**headers, "Content-Type": file.content_type})


async def page(request: Request, *, name: str) -> Response:
    return file_response(request, name)


async def asset(request: Request) -> Response:
    return file_response(request, request.path_params["name"])


def webui_routes() -> list[Route]:
    """``GET /`` (chat), ``GET /dashboard`` and ``GET /webui/{name}`` (their files)."""
    routes = [
        Route(path, partial(page, name=name), methods=["GET"]) for path, name in PAGES.items()
    ]
    routes.append(Route(ASSET_PREFIX + "{name}", asset, methods=["GET"]))
    return routes
