"""``met``: the command line (``met generate``, ``met serve``; memory and bench come as they land).

``metrale-serve`` is ``met serve`` as a command of its own.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from metrale_bench.cli import bench
from metrale_config import ConfigError, check_environment, read_int_lever
from metrale_server.cli.plan_options import plan_options
from metrale_server.cli.serve_args import LOG_LEVELS
from metrale_server.engine.args import EngineArgs
from metrale_server.engine.devices import DTYPES, resolve_device

MODEL_HELP = (
    "A local model directory (config.json + safetensors), a .gguf file, or a name found in the "
    "HF hub cache. Default: the bundled SmolLM2-135M-Instruct."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="metrale-server", prog_name="met")
def main() -> None:
    """Metrale: an LLM inference server."""
    _check_environment()


def _check_environment() -> None:
    try:
        check_environment()
    except ConfigError as error:
        raise click.UsageError(str(error)) from error


@main.command()
@click.argument("prompt")
@click.option("--model", "-m", default=None, help=MODEL_HELP)
@click.option(
    "--chat", is_flag=True, help="Wrap PROMPT as a user message in the model's chat template."
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=128,
    show_default=True,
    help="New tokens at most.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="Sampling temperature; 0 is greedy.",
)
@click.option("--seed", type=int, default=None, help="Seed for sampling (same seed, same text).")
@click.option(
    "--dtype",
    type=click.Choice(["auto", *DTYPES]),
    default="auto",
    show_default=True,
    help="Activation and weight dtype; auto is float32 on CPU, bfloat16 on CUDA.",
)
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
def generate(
    prompt: str,
    model: str | None,
    chat: bool,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    dtype: str,
    device: str,
) -> None:
    """Print the model's continuation of PROMPT."""
    from metrale_server.cli.generate import run_generate

    try:
        run_generate(
            prompt,
            model=model,
            chat=chat,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            dtype=dtype,
            device=device,
            out=sys.stdout,
        )
    except (ValueError, OSError) as error:
        # Config, checkpoint, tokenizer and model-resolution errors all say what is wrong.
        raise click.ClickException(str(error)) from error


_ENGINE_DEFAULTS = EngineArgs()
_FILE = click.Path(exists=True, dir_okay=False, readable=True, path_type=Path)


@main.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", required=False)
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
    "--enable-prefix-caching/--no-enable-prefix-caching",
    default=_ENGINE_DEFAULTS.enable_prefix_caching,
    show_default=True,
    help="Reuse the KV blocks of prompt prefixes computed before (usage reports them as "
    "prompt_tokens_details.cached_tokens).",
)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    help="Require 'Authorization: Bearer KEY' on /v1/*, /tokenize and /detokenize (repeatable; "
    "/health*, /metrics and /memory stay open).",
)
@click.option(
    "--api-key-file",
    type=_FILE,
    default=None,
    help="Read more API keys from FILE, one per line.",
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
    host: str,
    port: int,
    served_model_name: str | None,
    max_seq_len: int | None,
    block_size: int,
    gpu_memory_utilization: float,
    max_batch_size: int | None,
    max_prefill_tokens: int,
    num_kv_blocks: int | None,
    kv_cache_memory_gib: float | None,
    enable_prefix_caching: bool,
    dtype: str,
    device: str,
    api_keys: tuple[str, ...],
    api_key_file: Path | None,
    request_timeout: float,
    drain_timeout: float,
    seed: int,
    chat_template: Path | None,
    no_tui: bool,
    log_level: str,
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API (default: the bundled SmolLM2).

    /health answers 503 while the model loads, then 200. SIGTERM drains in-flight requests
    (see --drain-timeout) and exits 0.
    """
    from metrale_model_arch import resolve_model
    from metrale_server.cli.serve_args import (
        ServeArgs,
        default_served_model_name,
        read_api_key_file,
        read_chat_template_file,
    )

    _check_environment()
    if any(not key.strip() for key in api_keys):
        raise click.BadParameter("an API key must not be empty", param_hint="'--api-key'")
    keys = tuple(key.strip() for key in api_keys)
    if api_key_file is not None:
        try:
            keys += read_api_key_file(api_key_file)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="'--api-key-file'") from error
    template = None
    if chat_template is not None:
        try:
            template = read_chat_template_file(chat_template)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="'--chat-template'") from error
    try:
        resolve_device(device)
    except (ValueError, RuntimeError) as error:
        raise click.BadParameter(str(error), param_hint="'--device'") from error
    if served_model_name is not None and not served_model_name.strip():
        raise click.BadParameter("must not be empty", param_hint="'--served-model-name'")
    try:
        source = resolve_model(model)
    except (ValueError, OSError) as error:
        raise click.ClickException(str(error)) from error
    args = ServeArgs(
        engine_args=EngineArgs(
            model=model,
            dtype=dtype,
            device=device,
            block_size=block_size,
            max_seq_len=max_seq_len,
            max_batch_size=max_batch_size,
            max_batch_tokens=max_prefill_tokens,
            num_kv_blocks=num_kv_blocks,
            kv_cache_memory_gib=kv_cache_memory_gib,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching,
            seed=seed,
        ),
        served_model_name=served_model_name or default_served_model_name(source),
        host=host,
        port=port,
        api_keys=keys,
        request_timeout_s=request_timeout or None,
        drain_timeout_s=drain_timeout,
        chat_template=template,
        max_body_bytes=read_int_lever("METRALE_MAX_BODY_BYTES"),
        log_level=log_level.lower(),
    )
    from metrale_server.cli.serve import ServeError, run_serve  # Hypercorn, Starlette
    from metrale_server.tui.serve_dashboard import is_dashboard_wanted

    try:
        exit_code = run_serve(args, show_dashboard=is_dashboard_wanted(no_tui=no_tui))
    except ServeError as error:
        raise click.ClickException(str(error)) from error
    click.get_current_context().exit(exit_code)


@main.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    default="http://127.0.0.1:8888",
    show_default=True,
    help="The server to watch (any metrale server, local or remote).",
)
@click.option("--api-key", default=None, help="Sent as 'Authorization: Bearer KEY'.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.25),
    default=1.0,
    show_default=True,
    help="Seconds between polls of the server.",
)
def top(url: str, api_key: str | None, interval: float) -> None:
    """Watch a running server in a live dashboard (q quits, tab switches panels, ? help)."""
    from metrale_server.cli.top import run_top

    click.get_current_context().exit(run_top(url, api_key=api_key, poll_interval_s=interval))


@main.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    default=None,
    help="Chat with the server at URL (default http://127.0.0.1:8888 unless --model is given).",
)
@click.option(
    "--model",
    "-m",
    default=None,
    help="Run MODEL in this process instead of talking to a server: a local model directory, "
    "a .gguf file, or a name found in the HF hub cache.",
)
@click.option("--api-key", default=None, help="Sent to --url as 'Authorization: Bearer KEY'.")
@click.option("--system", default=None, help="A system message that starts the conversation.")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="New tokens at most per reply.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0.0),
    default=0.7,
    show_default=True,
    help="Sampling temperature; 0 is greedy.",
)
def chat(
    url: str | None,
    model: str | None,
    api_key: str | None,
    system: str | None,
    max_tokens: int,
    temperature: float,
) -> None:
    """Chat in the terminal; replies stream. /reset forgets the conversation, /exit quits."""
    if url is not None and model is not None:
        raise click.UsageError("give --url or --model, not both")
    from metrale_server.cli.chat import run_chat
    from metrale_server.tui.chat_backends import ChatBackend, EngineChatBackend, HttpChatBackend

    backend: ChatBackend
    if model is not None:
        from metrale_server.engine.engine import Engine

        try:
            engine = Engine(EngineArgs(model=model))
        except (ValueError, OSError) as error:
            raise click.ClickException(str(error)) from error
        backend = EngineChatBackend(
            engine, model_name=model, max_tokens=max_tokens, temperature=temperature
        )
    else:
        backend = HttpChatBackend(
            url or "http://127.0.0.1:8888",
            api_key=api_key,
            max_tokens=max_tokens,
            temperature=temperature,
        )
    click.get_current_context().exit(run_chat(backend, system_prompt=system))


@main.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", required=False)
@plan_options
@click.option(
    "--device-memory-gib",
    type=click.FloatRange(min=0.0, min_open=True),
    default=None,
    help="Plan for a device of this many GiB instead of this machine's (e.g. with "
    "--device cuda on a machine without a GPU).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def memory(
    model: str | None,
    max_seq_len: int | None,
    block_size: int,
    gpu_memory_utilization: float,
    max_batch_size: int | None,
    max_prefill_tokens: int,
    num_kv_blocks: int | None,
    kv_cache_memory_gib: float | None,
    dtype: str,
    device: str,
    device_memory_gib: float | None,
    as_json: bool,
) -> None:
    """Print the memory plan of serving MODEL with these flags, from its config alone.

    MODEL is what `met serve` takes, or a config.json file; no weight is read. Exits 1 when
    the serve would not fit, naming the term and the flags to change.
    """
    from metrale_server.cli.memory import run_memory

    _check_environment()
    try:
        engine_args = EngineArgs(
            model=model,
            dtype=dtype,
            device=device,
            block_size=block_size,
            max_seq_len=max_seq_len,
            max_batch_size=max_batch_size,
            max_batch_tokens=max_prefill_tokens,
            num_kv_blocks=num_kv_blocks,
            kv_cache_memory_gib=kv_cache_memory_gib,
            gpu_memory_utilization=gpu_memory_utilization,
        )
        exit_code = run_memory(
            model, engine_args, device_memory_gib=device_memory_gib, as_json=as_json
        )
    except (ValueError, OSError, RuntimeError) as error:
        raise click.ClickException(str(error)) from error
    click.get_current_context().exit(exit_code)


main.add_command(bench)


def serve_main() -> None:
    """``metrale-serve``: ``met serve`` as a command of its own."""
    serve.main(prog_name="metrale-serve")
