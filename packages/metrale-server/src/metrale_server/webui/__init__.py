"""The web UI: a chat page at ``/`` and a server dashboard at ``/dashboard``, plain HTML, CSS
and JavaScript of our own shipped in the wheel (no build step, nothing from the network)."""

from __future__ import annotations

from metrale_server.webui.pages import is_webui_path, webui_routes

__all__ = ["is_webui_path", "webui_routes"]
