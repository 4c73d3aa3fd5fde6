"""``ServeArgs``: what ``met serve`` was asked for, checked, plus the parsers for its files."""

from __future__ import annotations

from pathlib import Path

import attrs

from metrale_model_arch import ChatTemplate, ModelSource
from metrale_server.args import EngineArgs
from metrale_server.image_limits import ImageLimits

ALL_INTERFACES = frozenset({"0.0.0.0", "::", "[::]", ""})


@attrs.frozen(kw_only=True)
class ServeArgs:
    """The server's settings; ``engine_args`` shapes the engine, the rest the HTTP side.

    ``request_timeout_s`` is ``None`` when requests may run for ever; ``drain_timeout_s`` bounds
    how long in-flight requests may run after SIGTERM. ``max_queued_requests`` ``None``: the
    default from the plan (:func:`default_max_queued_requests`), 0: no bound.
    ``max_connections`` ``None``: room for the requests the server holds plus spare ones
    (``connection_cap.default_max_connections``), 0: only the open-files limit.
    ``allowed_hosts`` empty: the default for ``host`` (``request_guard.default_allowed_hosts``),
    ``*`` among them: any. ``is_webui``: serve the chat page at ``/`` and the dashboard at
    ``/dashboard``.
    """

    engine_args: EngineArgs
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = 8888
    api_keys: tuple[str, ...] = attrs.field(default=(), repr=False)
    request_timeout_s: float | None = 300.0
    drain_timeout_s: float = 30.0
    chat_template: ChatTemplate | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    max_body_bytes: int = 8 * 2**20
    max_queued_requests: int | None = None
    max_connections: int | None = None
    image_limits: ImageLimits = attrs.field(factory=ImageLimits)
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    protect_observability: bool = False
    is_webui: bool = True
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    log_level: str = "info"

    @property
    def is_tls(self) -> bool:
        return self.ssl_certfile is not None

    @property
    def is_all_interfaces(self) -> bool:
        return self.host in ALL_INTERFACES

    @property
    def bind(self) -> str:
        """The address as Hypercorn takes it (IPv6 hosts in brackets)."""
        host = self.host.strip("[]")
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


# Requests that may wait for the running batch, per sequence the batch holds, by default.
QUEUED_PER_BATCH_SLOT = 4


def default_max_queued_requests(max_batch_size: int) -> int:
    return QUEUED_PER_BATCH_SLOT * max_batch_size


def default_served_model_name(source: ModelSource) -> str:
    """A GGUF file serves under its file stem; anything else under the name it was asked by."""
    return source.path.stem if source.kind == "gguf" else source.name


def read_api_key_file(path: str | Path) -> tuple[str, ...]:
    """One key per line; blank lines and surrounding whitespace are ignored.

    Raises ``ValueError`` when the file cannot be read or holds no key.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    keys = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not keys:
        raise ValueError(f"{path} holds no API key (one key per line)")
    return keys


def read_chat_template_file(path: str | Path) -> ChatTemplate:
    """A Jinja2 chat template file, compiled; raises ``ValueError`` if it cannot be used.

    The special-token variables (``bos_token``...) are filled in once the tokenizer is loaded.
    """
    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    if not source.strip():
        raise ValueError(f"{path} is empty")
    return ChatTemplate(source=source, origin=str(path))  # ChatTemplateError is a ValueError
