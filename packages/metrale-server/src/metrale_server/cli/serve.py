"""``met serve`` (and ``metrale-serve``): the command line of the HTTP server.

The flags are checked here; ``metrale_server.cli.serve_runtime.run_serve`` runs the server (its
imports — torch, Hypercorn, Starlette — are deferred until the flags are known to be good).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import click

from metrale_config import read_int_lever
from metrale_server.args import EngineArgs
from metrale_server.cli.common import (
    CONTEXT,
    LOG_LEVELS,
    check_environment_or_exit,
    locate_model,
    offline_option,
    revision_option,
)
from metrale_server.cli.plan_options import PlanOptions, plan_options
from metrale_server.image_limits import (
    DEFAULT_FETCH_TIMEOUT_S,
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageLimits,
)
from metrale_server.parsers import REASONING_PARSER_NAMES, TOOL_CALL_PARSER_NAMES

_ENGINE_DEFAULTS = EngineArgs()
_FILE = click.Path(exists=True, dir_okay=False, readable=True, path_type=Path)


@click.command(context_settings=CONTEXT)
@click.argument("model", required=False)
@revision_option
@offline_option
@plan_options
@click.option(
    "--host",
    "--bind",
    "host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. 0.0.0.0 or :: opens the server to every interface (logged "
    "as a warning).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8888,
    show_default=True,
    help="TCP port; 0 picks a free one (the log says which).",
)
@click.option(
    "--served-model-name",
    "--model-name",
    "served_model_name",
    default=None,
    help="The model name clients send and /v1/models lists. Default: MODEL as given, or the "
    "GGUF file's stem.",
)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    envvar="METRALE_API_KEY",
    help="Require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize and the rerank "
    "aliases (repeatable; /health* stays open, and /metrics and /memory unless protected "
    "too). Also "
    "METRALE_API_KEY (whitespace-separated keys), out of sight of ps.",
)
@click.option(
    "--api-key-file",
    type=_FILE,
    default=None,
    help="Read more API keys from FILE, one per line.",
)
@click.option(
    "--protect-observability",
    is_flag=True,
    help="Put /metrics and /memory behind the API key too.",
)
@click.option(
    "--allowed-hosts",
    multiple=True,
    help="Host names the server answers to (repeatable; '*': any). Default: this machine's "
    "names when bound to a loopback address (a web page that rebinds its own name to it gets "
    "a 400), any otherwise.",
)
@click.option(
    "--allowed-origins",
    multiple=True,
    help="Web origins (https://app.example) whose pages may call the API, by CORS (repeatable; "
    "'*': any). Default: none.",
)
@click.option(
    "--ssl-certfile",
    type=_FILE,
    default=None,
    help="Serve HTTPS with this PEM certificate (chain).",
)
@click.option(
    "--ssl-keyfile",
    type=_FILE,
    default=None,
    help="The private key of --ssl-certfile, when the certificate file does not hold it.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1024),
    default=None,
    help="Largest request body accepted, in bytes (413 past it). Default: "
    "METRALE_MAX_BODY_BYTES, else 8 MiB.",
)
@click.option(
    "--max-image-bytes",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_IMAGE_BYTES,
    show_default=True,
    help="Largest image accepted, in bytes (a 400 naming the part past it); an image sent "
    "as base64 is also bounded by the body limit.",
)
@click.option(
    "--max-image-pixels",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_IMAGE_PIXELS,
    show_default=True,
    help="Most pixels (width x height) of an image, checked before it is decoded.",
)
@click.option(
    "--allow-image-urls",
    is_flag=True,
    default=False,
    help="Fetch the http(s) URLs of image parts (within the fetch timeout and the image "
    "byte limit); by default only data URLs are taken.",
)
@click.option(
    "--image-fetch-timeout",
    type=click.FloatRange(min=0.0, min_open=True),
    default=DEFAULT_FETCH_TIMEOUT_S,
    show_default=True,
    help="Seconds a fetch of an image URL may take in all.",
)
@click.option(
    "--max-queued-requests",
    type=click.IntRange(min=0),
    default=None,
    help="Requests that may wait for the running batch; past it a 429 with Retry-After. "
    "Default: 4 per sequence the batch holds; 0: no bound.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=0),
    default=None,
    help="Open client connections; past it a new one is answered 503 with Retry-After and "
    "closed. Default: the requests the server holds (batch + queue) plus 64; 0: only the "
    "open-files limit.",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0.0),
    default=300.0,
    show_default=True,
    help="Seconds a request may run; past it the request ends with finish_reason 'length' "
    "(and a log line saying it timed out). 0 disables.",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0.0),
    default=30.0,
    show_default=True,
    help="After SIGTERM or SIGINT, seconds in-flight requests may still run before they are "
    "aborted (a second signal exits at once).",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=_ENGINE_DEFAULTS.seed,
    show_default=True,
    help="Seed of the sampler shared by requests that bring no seed of their own.",
)
@click.option(
    "--chat-template",
    type=_FILE,
    default=None,
    help="A Jinja2 chat template FILE to use instead of the model's own.",
)
@click.option(
    "--tool-call-parser",
    type=click.Choice(TOOL_CALL_PARSER_NAMES),
    default=None,
    help="Read tool calls out of chat outputs in this model family's format (vLLM's names) "
    "when tool_choice is auto, the default with tools. Without it such requests get a 400; "
    "'required' and named functions are enforced by a grammar either way.",
)
@click.option(
    "--enable-auto-tool-choice",
    is_flag=True,
    help="Accepted as vLLM's command lines write it; --tool-call-parser alone turns auto on.",
)
@click.option(
    "--reasoning-parser",
    type=click.Choice(REASONING_PARSER_NAMES),
    default=None,
    help="Split <think>...</think> out of chat outputs into reasoning_content (vLLM's names).",
)
@click.option(
    "--no-webui",
    is_flag=True,
    help="Serve no web UI: by default GET / is a chat page and GET /dashboard a page of live "
    "charts, both from this server's own files (no key needed to load them; their requests "
    "carry the key).",
)
@click.option(
    "--no-tui",
    is_flag=True,
    help="Plain log lines on stderr, no dashboard (also METRALE_NO_TUI=1; the dashboard only "
    "shows when stdin and stdout are terminals).",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    help="Least severe log lines written to stderr.",
)
def serve(
    model: str | None,
    revision: str | None,
    offline: bool,
    plan: PlanOptions,
    host: str,
    port: int,
    served_model_name: str | None,
    api_keys: tuple[str, ...],
    api_key_file: Path | None,
    protect_observability: bool,
    allowed_hosts: tuple[str, ...],
    allowed_origins: tuple[str, ...],
    ssl_certfile: Path | None,
    ssl_keyfile: Path | None,
    max_body_bytes: int | None,
    max_image_bytes: int,
    max_image_pixels: int,
    allow_image_urls: bool,
    image_fetch_timeout: float,
    max_queued_requests: int | None,
    max_connections: int | None,
    request_timeout: float,
    drain_timeout: float,
    seed: int,
    chat_template: Path | None,
    tool_call_parser: str | None,
    enable_auto_tool_choice: bool,
    reasoning_parser: str | None,
    no_webui: bool,
    no_tui: bool,
    log_level: str,
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API (default: the bundled SmolLM2).

    MODEL is a local directory or .gguf file, or a Hugging Face repo id (org/name,
    org/name/FILE.gguf) looked up in the HF hub cache and, when missing there, downloaded into
    it (not with --offline or HF_HUB_OFFLINE=1). /health answers 503 while the model loads,
    then 200. SIGTERM drains in-flight requests (see --drain-timeout) and exits 0.
    """
    from metrale_server.cli.serve_args import (
        ServeArgs,
        default_served_model_name,
        read_api_key_file,
        read_chat_template_file,
    )

    check_environment_or_exit()
    if any(not key.strip() for key in api_keys):
        raise click.BadParameter("an API key must not be empty", param_hint="'--api-key'")
    keys = tuple(key.strip() for key in api_keys)
    if api_key_file is not None:
        try:
            keys += read_api_key_file(api_key_file)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="'--api-key-file'") from error
    if protect_observability and not keys:
        raise click.BadParameter(
            "needs an API key (--api-key, --api-key-file or METRALE_API_KEY) to protect them with",
            param_hint="'--protect-observability'",
        )
    if ssl_keyfile is not None and ssl_certfile is None:
        raise click.BadParameter("needs --ssl-certfile", param_hint="'--ssl-keyfile'")
    if enable_auto_tool_choice and tool_call_parser is None:
        raise click.BadParameter(
            "needs --tool-call-parser to say how the model writes its calls",
            param_hint="'--enable-auto-tool-choice'",
        )
    template = None
    if chat_template is not None:
        try:
            template = read_chat_template_file(chat_template)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="'--chat-template'") from error
    from metrale_server.devices import check_kernel_backend, resolve_device  # torch

    try:
        device = resolve_device(plan.device)
    except (ValueError, RuntimeError) as error:
        raise click.BadParameter(str(error), param_hint="'--device'") from error
    try:
        check_kernel_backend(plan.kernel_backend, device)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="'--kernel-backend'") from error
    plan = _join_launcher(plan)
    if plan.speculative_config is not None and plan.tensor_parallel_size > 1:
        raise click.BadParameter(
            "does not run with --tensor-parallel-size > 1 yet", param_hint="'--speculative-config'"
        )
    if served_model_name is not None and not served_model_name.strip():
        raise click.BadParameter("must not be empty", param_hint="'--served-model-name'")
    engine_model, source = locate_model(model, revision=revision, offline=offline)
    args = ServeArgs(
        engine_args=plan.engine_args(engine_model, seed=seed),
        served_model_name=served_model_name or default_served_model_name(source),
        host=host,
        port=port,
        api_keys=keys,
        request_timeout_s=request_timeout or None,
        drain_timeout_s=drain_timeout,
        chat_template=template,
        tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
        max_body_bytes=max_body_bytes or read_int_lever("METRALE_MAX_BODY_BYTES"),
        max_queued_requests=max_queued_requests,
        max_connections=max_connections,
        image_limits=ImageLimits(
            max_bytes=max_image_bytes,
            max_pixels=max_image_pixels,
            allow_urls=allow_image_urls,
            fetch_timeout_s=image_fetch_timeout,
        ),
        allowed_hosts=allowed_hosts,
        allowed_origins=allowed_origins,
        protect_observability=protect_observability,
        is_webui=not no_webui,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
        log_level=log_level.lower(),
    )
    from metrale_server.cli.serve_runtime import (  # Hypercorn, Starlette, torch
        ServeError,
        run_serve,
    )
    from metrale_server.tui.serve_dashboard import is_dashboard_wanted

    try:
        exit_code = run_serve(args, show_dashboard=is_dashboard_wanted(no_tui=no_tui))
    except ServeError as error:
        raise click.ClickException(str(error)) from error
    click.get_current_context().exit(exit_code)


def _join_launcher(plan: PlanOptions) -> PlanOptions:
    """Under torchrun: rank 0 goes on to serve (``--tensor-parallel-size`` defaults to
    WORLD_SIZE); every other rank becomes a worker and exits when rank 0 ends the group."""
    from metrale_server.devices import resolve_device
    from metrale_server.engine.distributed import Rendezvous

    try:
        launched = Rendezvous.from_environ()
    except ValueError as error:
        raise click.ClickException(str(error)) from error
    if launched is None:
        return plan
    if plan.tensor_parallel_size not in (1, launched.world_size):
        raise click.BadParameter(
            f"{plan.tensor_parallel_size}, but the launcher started WORLD_SIZE="
            f"{launched.world_size} ranks",
            param_hint="'--tensor-parallel-size'",
        )
    if launched.rank != 0:
        from metrale_server.cli.serve_runtime import configure_logging
        from metrale_server.engine.distributed.worker import run_worker

        configure_logging("info")
        click.get_current_context().exit(run_worker(launched, resolve_device(plan.device).type))
    return attrs.evolve(plan, tensor_parallel_size=launched.world_size)


def serve_main() -> None:
    """``metrale-serve``: ``met serve`` as a command of its own."""
    serve.main(prog_name="metrale-serve")
