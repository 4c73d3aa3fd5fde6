"""``met serve``: listen at once (``/health`` is 503 while the model loads), serve, drain on
SIGTERM.

Lifecycle: the socket is bound first, so a port already taken fails before anything loads.
Hypercorn serves a ``LoadingApp`` while a worker thread loads the model; once the ``Engine``
and its ``AsyncEngine`` exist, the API app (``create_app``) takes over and the state turns
ready. SIGTERM or SIGINT marks the state draining and lets in-flight requests run for up to
``drain_timeout_s`` while the socket keeps listening: ``/health`` answers 503 ``draining`` and
new generation requests 503, as vLLM does. At the deadline the engine stops, which ends what is
left with an error event (streams) or a 500. Only then does the listener close, and
``run_serve`` returns 0 once every connection has closed (at most ``CONNECTION_GRACE_S`` later:
Hypercorn cuts the rest). A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import os
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING, cast

from hypercorn.config import Config, Sockets

from metrale_model_arch.loading import ProgressObserver
from metrale_model_arch.memory import MemoryPlan, MemoryPlanError
from metrale_server.api.loading_app import LoadingApp
from metrale_server.api.request_guard import default_allowed_hosts
from metrale_server.cli.connection_cap import (
    ConnectionCount,
    cap_connections,
    default_max_connections,
    raise_open_files_limit,
)
from metrale_server.cli.serve_args import ServeArgs, default_max_queued_requests
from metrale_server.devices import (
    format_choice_lines,
    kernel_summary,
)
from metrale_server.engine.bootstrap import build_engine
from metrale_server.engine.distributed.process_group import backend_for
from metrale_server.engine.engine import Engine
from metrale_server.engine.layer_compiler import LayerCompiler
from metrale_server.engine.rank_setup import plan_engine, resolve_target
from metrale_server.memory.host_memory import record_mem_available_at_start
from metrale_server.memory.preflight import PreflightError, kv_format, plan_log_lines
from metrale_server.structured import GRAMMAR_BACKEND
from metrale_server.tui.serve_dashboard import ServeDashboard, local_url

if TYPE_CHECKING:
    from metrale_server.api import ServerState
    from metrale_server.engine.async_engine import AsyncEngine

logger = logging.getLogger("metrale.serve")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
EXIT_FORCED = 1
EXIT_LOAD_FAILED = 1
EXIT_WORKER_LOST = 1
CONNECTION_GRACE_S = 5.0
DRAIN_POLL_S = 0.05
BACKGROUND_JOIN_S = 30.0


class ServeError(RuntimeError):
    """The server cannot start (e.g. the address is taken); the message names the flag."""


def run_serve(args: ServeArgs, *, show_dashboard: bool = False) -> int:
    """Serve until SIGTERM/SIGINT. Returns 0 after a drain, 1 if the model failed to load.

    ``show_dashboard``: draw the terminal dashboard on stdout (its ``q`` drains like SIGINT)
    and send the log lines to its log panel instead of stderr.
    """
    configure_logging(args.log_level)
    plan = preflight(args)
    config = hypercorn_config(args)
    try:
        sockets = config.create_sockets()
    except OSError as error:
        raise ServeError(
            f"cannot listen on {args.bind} (--host/--port): {error.strerror or error}"
        ) from error
    sockets, connections = _capped(sockets, args)
    dashboard = _start_dashboard(args, sockets) if show_dashboard else None
    try:
        warn_if_exposed(args)
        scheme = "https" if args.is_tls else "http"
        for sock in _listening(sockets):
            host, port = sock.getsockname()[:2]
            logger.info(
                "address: %s://%s/ (/health is 503 until the model is loaded%s)",
                scheme,
                _url_host(host, port),
                "; a browser gets the chat here, the dashboard at /dashboard" * args.is_webui,
            )
        # The model loads on its own thread from here on, while the rest of the server (the
        # HTTP stack, the API app) is imported and started on this one.
        front = LoadingApp(args.served_model_name)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="metrale-load") as pool:
            loading = pool.submit(load_engine, args, plan, front.set_progress)
            # The loader thread ends once the model is built. NOTE: a live thread that ever
            # ran torch keeps its OpenMP team, and with it alive the engine thread's small
            # int8 matmuls ran at half speed (measured: 45 -> 100 us per call).
            pool.shutdown(wait=False)
            return asyncio.run(_serve(args, config, sockets, front, loading, connections))
    finally:
        if dashboard is not None:
            dashboard.close()


def _start_dashboard(args: ServeArgs, sockets: Sockets) -> ServeDashboard:
    host, port = _listening(sockets)[0].getsockname()[:2]
    dashboard = ServeDashboard(
        local_url(host, port, scheme="https" if args.is_tls else "http"),
        api_key=args.api_keys[0] if args.api_keys else None,
    )
    dashboard.start()
    return dashboard


def warn_if_exposed(args: ServeArgs) -> None:
    """A warning when the server listens on every interface, not only this machine."""
    if args.is_all_interfaces:
        logger.warning(
            "bound to all interfaces (%s): anyone who can reach this machine can use the server%s",
            args.host,
            "" if args.api_keys else "; consider --api-key",
        )


def configure_logging(level: str) -> None:
    """Plain log lines on stderr (the dashboard, when shown, takes them over); Hypercorn's
    chatter only at debug."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if level != "debug":
        logging.getLogger("hypercorn.error").setLevel(logging.WARNING)


def hypercorn_config(args: ServeArgs) -> Config:
    config = Config()
    config.bind = [args.bind]
    # Hypercorn's shutdown starts once the drain has ended every request; it cuts connections
    # still open after the grace (a client that stopped reading).
    config.graceful_timeout = CONNECTION_GRACE_S
    # NOTE: no read_timeout: Hypercorn's closes a connection that sends nothing for that long,
    # even while its response streams (a generation over a minute was cut). A body that stops
    # arriving is the app's to refuse (ServerState.body_read_timeout_s).
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    if args.ssl_certfile is not None:
        config.certfile = str(args.ssl_certfile)
        config.keyfile = None if args.ssl_keyfile is None else str(args.ssl_keyfile)
    return config


def _capped(sockets: Sockets, args: ServeArgs) -> tuple[Sockets, ConnectionCount]:
    """The listening sockets under one connection cap: ``--max-connections``, else (until the
    engine's batch is known, see ``max_connections``) the open-files limit."""
    open_files = raise_open_files_limit()
    count = ConnectionCount(
        limit=args.max_connections or default_max_connections(None, open_files),
        open_files_limit=open_files,
    )
    secure = cap_connections(list(sockets.secure_sockets), count, is_tls=True)
    insecure = cap_connections(list(sockets.insecure_sockets), count, is_tls=False)
    return Sockets(secure, insecure, sockets.quic_sockets), count


def max_connections(args: ServeArgs, engine: Engine, open_files_limit: int) -> int:
    """``--max-connections`` (0: the open-files limit), by default room for the batch, the
    queue and spare connections."""
    if args.max_connections is not None:
        return args.max_connections or default_max_connections(None, open_files_limit)
    queued = queue_bound(args, engine)
    held = None if queued is None else queued + engine.max_batch_size
    return default_max_connections(held, open_files_limit)


def _listening(sockets: Sockets) -> list[socket.socket]:
    return [*sockets.secure_sockets, *sockets.insecure_sockets]


def preflight(args: ServeArgs) -> MemoryPlan:
    """Plan memory from the config alone and log it, one line per owner; raises ``ServeError``
    naming the term and the flags when the serve cannot fit. Nothing is loaded yet."""
    record_mem_available_at_start()
    engine_args = args.engine_args
    try:
        target = resolve_target(engine_args)  # the CLI has checked the device already
    except (ValueError, OSError) as error:  # ConfigError is a ValueError
        raise ServeError(f"cannot read the model's config: {error}") from error
    try:
        plan = plan_engine(engine_args, target)
    except (MemoryPlanError, PreflightError) as error:
        raise ServeError(f"memory preflight: {error}") from error
    except ValueError as error:  # a format the model type has no path for
        raise ServeError(f"cannot plan this serve: {error}") from error
    if engine_args.tensor_parallel_size > 1:
        logger.info(
            "tensor parallel size %d: the plan below is each rank's",
            engine_args.tensor_parallel_size,
        )
    for line in plan_log_lines(plan, target.config):
        logger.info("%s", line)
    return plan


def load_engine(
    args: ServeArgs, plan: MemoryPlan, on_progress: ProgressObserver | None = None
) -> Engine:
    """:func:`~metrale_server.engine.bootstrap.build_engine` (with ``--chat-template`` in place
    of the model's own; ``on_progress(done, total)`` per checkpoint tensor), then, on a first
    start on a CPU, the build of the native kernels (the log names each source as it
    compiles): until they are built the reference ops would serve, and on the default model's
    q4 weights those take tens of times longer."""
    engine = build_engine(
        args.engine_args, plan=plan, chat_template=args.chat_template, on_progress=on_progress
    )
    engine.wait_for_native_kernels()
    return engine


def log_boot(engine: Engine, args: ServeArgs) -> None:
    """One line per fact an operator checks first; never any prompt text."""
    loaded = engine.loaded
    plan = engine.plan
    logger.info(
        "model: %s (%s %s), served as %r",
        loaded.source.name,
        loaded.source.kind,
        loaded.source.path,
        args.served_model_name,
    )
    logger.info("task: %s", engine.task.describe())
    logger.info(
        "dtype: %s; weights: %s; kernels: %s",
        str(loaded.dtype).removeprefix("torch."),
        loaded.quantization,
        kernel_summary(loaded),
    )
    for line in format_choice_lines(
        loaded,
        quantization_flag=args.engine_args.quantization,
        tensor_parallel_size=args.engine_args.tensor_parallel_size,
    ):
        logger.info("%s", line)
    logger.info("layer steps: %s", LayerCompiler.state(engine.core.compiler, loaded.model))
    logger.info("device: %s", loaded.device)
    parallel = engine.core.parallel
    if parallel is not None:
        workers = ", ".join(
            f"rank {rank} pid {process.pid}"
            for rank, process in enumerate(parallel.processes, start=1)
        )
        logger.info(
            "tensor parallel: %d ranks over %s (%s); only rank 0 samples",
            parallel.world_size,
            backend_for(loaded.device.type),
            workers or "started by the launcher",
        )
    logger.info(
        "KV pool: %d blocks x %d tokens (%.1f MiB, %s)%s; allocation ledger: %.1f MiB live",
        engine.num_kv_blocks,
        plan.inputs.block_size,
        plan.kv_pool_bytes / 2**20,
        kv_format(plan.inputs),
        _prefix_caching_note(engine),
        engine.ledger.live_bytes() / 2**20,
    )
    logger.info(
        "max batch: %d sequences, %d tokens per step",
        engine.max_batch_size,
        engine.args.max_batch_tokens,
    )
    logger.info("max seq len: %d", engine.max_seq_len)
    speculative = engine.args.speculative_config
    if speculative is not None:
        source = (
            f"draft model {speculative.model}"
            if speculative.model is not None
            else "the model's MTP layer, its K/V in the draft pool"
            if speculative.is_mtp
            else f"lookup n = {speculative.prompt_lookup_min}..{speculative.prompt_lookup_max}"
        )
        logger.info(
            "speculative decoding: %s, up to %d draft tokens (%s)",
            speculative.method,
            speculative.num_speculative_tokens,
            source,
        )
    logger.info(
        "structured outputs: %s; tool calls: %s; reasoning: %s",
        GRAMMAR_BACKEND,
        "required/named by grammar"
        + (f", auto read as {args.tool_call_parser}" if args.tool_call_parser else ""),
        args.reasoning_parser or "not split (no --reasoning-parser)",
    )


async def _serve(
    args: ServeArgs,
    config: Config,
    sockets: Sockets,
    front: LoadingApp,
    loading: concurrent.futures.Future[Engine],
    connections: ConnectionCount,
) -> int:
    from hypercorn.asyncio.run import worker_serve
    from hypercorn.typing import ASGIFramework
    from hypercorn.utils import wrap_app

    from metrale_server.api import ServerState, create_app
    from metrale_server.api.request_log import LoggingServerMetrics
    from metrale_server.engine.async_engine import AsyncEngine

    stop = asyncio.Event()
    exit_code = 0
    state: ServerState | None = None
    serving: AsyncEngine | None = None
    background: list[threading.Thread] = []
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            logger.warning("%s again: exiting without draining", name)
            os._exit(EXIT_FORCED)
        logger.info(
            "%s: draining; in-flight requests may run for %g s more", name, args.drain_timeout_s
        )
        if state is not None:
            state.is_draining = True
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)

    def on_worker_lost(message: str) -> None:
        nonlocal exit_code
        logger.error("stopping the server: %s", message)
        exit_code = EXIT_WORKER_LOST
        if state is not None:
            state.is_draining = True
        stop.set()

    async def load() -> AsyncEngine | None:
        nonlocal exit_code, state, serving
        try:
            engine = await asyncio.wrap_future(loading)
        except Exception as error:
            logger.error("cannot load the model: %s", error)
            exit_code = EXIT_LOAD_FAILED
            stop.set()
            return None
        async_engine = serving = AsyncEngine(engine)
        if engine.core.parallel is not None:

            def worker_lost(message: str) -> None:
                loop.call_soon_threadsafe(on_worker_lost, message)

            engine.core.parallel.channel.on_failure(worker_lost)
        state = ServerState(
            engine=async_engine,
            served_model_name=args.served_model_name,
            api_keys=args.api_keys,
            request_timeout_s=args.request_timeout_s,
            max_body_bytes=args.max_body_bytes,
            image_limits=args.image_limits,
            tool_call_parser=args.tool_call_parser,
            reasoning_parser=args.reasoning_parser,
            allowed_hosts=allowed_hosts(args),
            allowed_origins=args.allowed_origins,
            protect_observability=args.protect_observability,
            max_queued_requests=queue_bound(args, engine),
            metrics=LoggingServerMetrics(async_engine, args.served_model_name),
            is_draining=stop.is_set(),
        )
        connections.limit = max_connections(args, engine, connections.open_files_limit)
        queued = state.max_queued_requests
        logger.info(
            "load bounds: %s requests may wait for the batch of %d (429 past it), %d open "
            "connections (503 past it; open-files limit %d)",
            "any number of" if queued is None else queued,
            engine.max_batch_size,
            connections.limit,
            connections.open_files_limit,
        )
        freeze_heap()
        front.serve(create_app(state, webui=args.is_webui))
        log_boot(engine, args)
        if not stop.is_set():
            state.is_ready = True
            logger.info("ready")
        # The grammar engine's tables of the vocabulary (~0.3 s), before the first request
        # that needs them; no torch runs on this thread. Joined before the process exits: a
        # SIGINT right after ready once ended the interpreter under it (SIGSEGV, in CI).
        tables = threading.Thread(
            target=lambda: engine.core.grammar_compiler, name="metrale-grammar-tables", daemon=True
        )
        tables.start()
        background.append(tables)
        return async_engine

    async def drained() -> None:
        """Hypercorn's shutdown trigger: after the signal, until no request is in flight or
        the drain deadline has stopped the engine under those left."""
        await stop.wait()
        deadline = loop.time() + args.drain_timeout_s
        while state is not None and state.num_active_requests and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if state is not None and state.num_active_requests:
            logger.warning(
                "drain timeout: stopping the engine under %d running requests",
                state.num_active_requests,
            )
            assert serving is not None  # set with state
            await asyncio.to_thread(serving.shutdown)

    loader = asyncio.create_task(load())
    try:
        await worker_serve(
            # Starlette's ASGI types and Hypercorn's describe the same protocol differently.
            wrap_app(cast(ASGIFramework, front), config.wsgi_max_body_size, "asgi"),
            config,
            sockets=sockets,
            shutdown_trigger=drained,
        )
    finally:
        async_engine = await loader
        for thread in background:
            await asyncio.to_thread(thread.join, BACKGROUND_JOIN_S)
        if state is not None:
            state.preparer.shutdown()
        if async_engine is not None:
            await asyncio.to_thread(async_engine.shutdown)
            await asyncio.to_thread(async_engine.engine.close)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    logger.info("stopped")
    return exit_code


def _prefix_caching_note(engine: Engine) -> str:
    if engine.core.prefix_caching:
        return ", prefix caching on"
    if engine.args.enable_prefix_caching and engine.core.has_sequence_state:
        return (
            ", prefix caching off (the model keeps per-sequence state a cached prefix would skip: "
            "linear-attention state, sliding-window K/V rings)"
        )
    return ""


def freeze_heap() -> None:
    """Leave the objects alive now (the model, torch, the tokenizer: millions) out of every
    later garbage collection: a full collection walked them all while every thread waited, and
    a burst of requests that allocate many objects (large JSON bodies) set one off, stalling
    /health for 0.41 s (measured; 0.08-0.11 s after this)."""
    gc.collect()
    gc.freeze()


def allowed_hosts(args: ServeArgs) -> frozenset[str] | None:
    """The ``Host`` names served: ``--allowed-hosts`` (``*``: any), else the bind's default."""
    if not args.allowed_hosts:
        return default_allowed_hosts(args.host)
    if "*" in args.allowed_hosts:
        return None
    return frozenset(host.strip("[]").lower() for host in args.allowed_hosts)


def queue_bound(args: ServeArgs, engine: Engine) -> int | None:
    """``--max-queued-requests`` (0: none), by default a few per sequence the batch holds."""
    if args.max_queued_requests is None:
        return default_max_queued_requests(engine.max_batch_size)
    return args.max_queued_requests or None


def _url_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
