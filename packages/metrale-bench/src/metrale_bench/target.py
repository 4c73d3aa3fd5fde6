"""``ServerTarget``: which OpenAI-compatible server a run talks to, and how."""

from __future__ import annotations

from typing import Any

import attrs
import httpx

from metrale_bench.types import Api

DEFAULT_TIMEOUT_S = 600.0


class TargetError(RuntimeError):
    """The server could not be reached or did not answer as an OpenAI-compatible one."""


def _without_trailing_slash(url: str) -> str:
    return url.rstrip("/")


@attrs.frozen(kw_only=True)
class ServerTarget:
    """A server's base URL (no ``/v1``), the endpoint to stream from, and the model name to
    send (``None``: the first model ``/v1/models`` lists)."""

    base_url: str = attrs.field(converter=_without_trailing_slash)
    api: Api = "completions"
    model: str | None = None
    api_key: str | None = attrs.field(default=None, repr=False)
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def endpoint_path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    def client(self, *, max_connections: int | None = None) -> httpx.AsyncClient:
        """An HTTP client for this server; close it (``async with``) when done."""
        headers = {} if self.api_key is None else {"Authorization": f"Bearer {self.api_key}"}
        return httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 30.0)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=None),
        )


async def resolve_model(client: httpx.AsyncClient, target: ServerTarget) -> str:
    """``target.model``, or the first model the server lists."""
    if target.model is not None:
        return target.model
    data = await get_json(client, "/v1/models")
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict):
        raise TargetError(f"{target.base_url}/v1/models lists no model")
    name = models[0].get("id")
    if not isinstance(name, str):
        raise TargetError(f"{target.base_url}/v1/models: the first model has no string id")
    return name


async def server_version(client: httpx.AsyncClient) -> dict[str, Any] | None:
    """The server's ``GET /version`` document, or ``None`` when it has none."""
    try:
        data = await get_json(client, "/version")
    except TargetError:
        return None
    return data if isinstance(data, dict) else {"version": data}


async def count_tokens(client: httpx.AsyncClient, model: str, text: str) -> int | None:
    """How many tokens the server's tokenizer makes of ``text`` without special tokens, from
    vLLM's ``POST /tokenize`` (metrale and vLLM have it); ``None`` when the server does not
    answer it with a count."""
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    try:
        response = await client.post("/tokenize", json=body)
        data = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    count = data.get("count") if isinstance(data, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else None


async def get_json(client: httpx.AsyncClient, path: str) -> Any:
    """``GET path`` as JSON; raises :class:`TargetError` on a transport error or a non-200."""
    try:
        response = await client.get(path)
    except httpx.HTTPError as error:
        raise TargetError(f"GET {path}: {error!r}") from error
    if response.status_code != 200:
        raise TargetError(f"GET {path}: HTTP {response.status_code}: {response.text[:200]}")
    try:
        return response.json()
    except ValueError as error:
        raise TargetError(f"GET {path}: the body is not JSON") from error
