"""``met bench`` (or ``metrale-bench``): the drivers, ``list`` and ``compare`` as a click group.

Every driver writes one record (``RECORDS_DIR/<benchmark>/<stamp>-<sha>.json``) and a PNG
beside it, prints their paths and the headline figures, and exits 1 when any request failed.
``RECORDS_DIR`` is ``--records-dir``, else ``$METRALE_BENCH_DIR``, else the user's data
directory (``records_dir.default_records_dir``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from metrale_bench.benchmarks.concurrency_sweep import (
    SweepSpec,
    doubling_levels,
    run_concurrency_sweep,
)
from metrale_bench.benchmarks.decode_floor import DecodeFloorSpec, run_decode_floor
from metrale_bench.benchmarks.default_tier_boot import TierBootSpec, run_default_tier_boot
from metrale_bench.benchmarks.serve import Workload, run_serve
from metrale_bench.benchmarks.ttft import TtftSpec, run_ttft
from metrale_bench.compare import compare_records, comparison_table, format_value
from metrale_bench.datasets import DatasetError
from metrale_bench.load import LoadSpec
from metrale_bench.metrics import Slo
from metrale_bench.records import BenchRecord, RecordError, find_records, read_record, write_record
from metrale_bench.records_dir import (
    DEFAULT_RECORDS_DIR_HELP,
    RECORDS_DIR_ENV,
    default_records_dir,
)
from metrale_bench.server_process import ServerStartError, running_server
from metrale_bench.streaming import SamplingSpec
from metrale_bench.sweep import sweep_levels
from metrale_bench.target import ServerTarget, TargetError

DEFAULT_BASE_URL = "http://127.0.0.1:8888"
PLOTS_EXTRA = "metrale-bench[plots]"
HEADLINES = {
    "serve": (
        "output_tok_s",
        "request_s",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "tpot_p50_ms",
        "itl_p50_ms",
        "e2e_p50_ms",
        "goodput_request_s",
        "num_failed",
    ),
    "decode-floor": ("decode_tok_s", "decode_tok_s_best", "client_tpot_p50_ms", "ttft_p50_ms"),
    "ttft": ("ttft_cold_p50_ms", "ttft_warm_p50_ms", "warm_over_cold"),
    "default-tier-boot": (
        "kv_blocks",
        "max_batch_size",
        "budget_mib",
        "device_footprint_mib",
        "footprint_over_budget_mib",
        "ledger_live_mib",
        "chat_output_tok_s",
    ),
}
SWEEP_HEADLINES = ("output_tok_s", "ttft_p50_ms", "tpot_p50_ms", "tpot_p90_ms", "e2e_p50_ms")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def _stdout() -> Console:
    # Piped output (CI logs, tests) gets wide tables rather than wrapped cells.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def target_options(function: F) -> F:
    """Where the server is and how to reach it."""
    options = [
        click.option(
            "--base-url",
            default=DEFAULT_BASE_URL,
            show_default=True,
            help="The server, without /v1.",
        ),
        click.option(
            "--api",
            type=click.Choice(["completions", "chat"]),
            default="completions",
            show_default=True,
            help="Stream from /v1/completions or /v1/chat/completions.",
        ),
        click.option(
            "--model",
            default=None,
            help="Model name to send (default: the first one /v1/models lists).",
        ),
        click.option(
            "--api-key",
            envvar="METRALE_API_KEY",
            default=None,
            help="Bearer token (or $METRALE_API_KEY).",
        ),
        click.option(
            "--timeout",
            "timeout_s",
            type=click.FloatRange(min=0, min_open=True),
            default=600.0,
            show_default=True,
            help="Seconds one request may take.",
        ),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def output_options(function: F) -> F:
    """Where the record goes and what is drawn."""
    options = [
        click.option(
            "--records-dir",
            type=click.Path(file_okay=False, path_type=Path),
            envvar=RECORDS_DIR_ENV,
            default=default_records_dir,
            show_default=DEFAULT_RECORDS_DIR_HELP,
            help=f"Records go to DIR/<benchmark>/ (or ${RECORDS_DIR_ENV}).",
        ),
        click.option("--no-plot", is_flag=True, help="Write no PNG."),
        click.option("--no-progress", is_flag=True, help="No progress bar."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def workload_options(function: F) -> F:
    """The prompts: random or ShareGPT."""
    options = [
        click.option(
            "--dataset",
            type=click.Choice(["random", "sharegpt"]),
            default="random",
            show_default=True,
            help=(
                "random: text prompts of random common English words, so any server accepts "
                "them whatever its vocabulary; sized to --random-input-len tokens with the "
                "tokens per word the server's /tokenize measures (one per word without it). "
                "The record keeps the server's own prompt counts (mean_input_tokens)."
            ),
        ),
        click.option(
            "--dataset-path",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            default=None,
            help="The ShareGPT JSON file.",
        ),
        click.option(
            "--random-input-len",
            type=click.IntRange(min=1),
            default=128,
            show_default=True,
            help="Prompt tokens, on average (see --dataset).",
        ),
        click.option(
            "--random-output-len", type=click.IntRange(min=1), default=128, show_default=True
        ),
        click.option(
            "--random-range-ratio",
            type=click.FloatRange(0, 1, max_open=True),
            default=0.0,
            show_default=True,
            help="Lengths are drawn from [L·(1−r), L·(1+r)].",
        ),
        click.option(
            "--sharegpt-output-len",
            type=click.IntRange(min=1),
            default=None,
            help="Fixed output length (default: the reference reply's).",
        ),
        click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True),
        click.option(
            "--seed",
            type=int,
            default=0,
            show_default=True,
            help="Seeds the dataset, the arrivals and the requests.",
        ),
        click.option(
            "--ignore-eos",
            is_flag=True,
            help="Send ignore_eos so every request makes all its tokens.",
        ),
        click.option(
            "--slo", default=None, help="Goodput SLOs in ms, e.g. 'ttft:500,tpot:50,e2e:4000'."
        ),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def _target(
    base_url: str, api: str, model: str | None, api_key: str | None, timeout_s: float
) -> ServerTarget:
    return ServerTarget(
        base_url=base_url,
        api="chat" if api == "chat" else "completions",
        model=model,
        api_key=api_key,
        timeout_s=timeout_s,
    )


def _workload(options: dict[str, Any], num_prompts: int) -> Workload:
    if options["dataset"] == "sharegpt" and options["dataset_path"] is None:
        raise click.UsageError("--dataset sharegpt needs --dataset-path")
    return Workload(
        dataset=options["dataset"],
        dataset_path=options["dataset_path"],
        num_prompts=num_prompts,
        random_input_len=options["random_input_len"],
        random_output_len=options["random_output_len"],
        random_range_ratio=options["random_range_ratio"],
        sharegpt_output_len=options["sharegpt_output_len"],
        seed=options["seed"],
    )


def _slo(text: str | None) -> Slo | None:
    if text is None:
        return None
    try:
        return Slo.parse(text)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="'--slo'") from error


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coroutine)
    except (TargetError, DatasetError, ServerStartError, ValueError) as error:
        raise click.ClickException(str(error)) from error


def finish(record: BenchRecord, records_dir: Path, *, plot: bool) -> None:
    """Write the record (and its plot), print the headline figures; exit 1 on failures."""
    path = write_record(record, records_dir).absolute()
    out = _stdout()
    out.print(f"record: {path}", soft_wrap=True)
    if plot:
        out.print(
            f"plot:   {_draw(record, path.with_suffix('.png'))}", soft_wrap=True, markup=False
        )
    out.print(headline_table(record))
    if record.num_failed:
        for error in record.errors:
            click.echo(f"error: {error}", err=True)
        click.echo(f"{record.num_failed} request(s) failed", err=True)
        sys.exit(1)


def _draw(record: BenchRecord, png: Path) -> str:
    """The plot's path, or why none was drawn (matplotlib is an extra)."""
    try:
        from metrale_bench.plots import plot_record  # matplotlib loads only when drawing
    except ModuleNotFoundError as error:
        if error.name is None or not error.name.startswith("matplotlib"):
            raise
        return f"not drawn: matplotlib is not installed (pip install {PLOTS_EXTRA!r})"
    return str(plot_record(record, png))


def headline_table(record: BenchRecord) -> Table:
    """The few figures a reader wants first (a sweep: one row per concurrency)."""
    if record.benchmark == "concurrency-sweep":
        table = Table(title="concurrency sweep")
        table.add_column("concurrency", justify="right")
        for name in SWEEP_HEADLINES:
            table.add_column(name, justify="right")
        for level in sweep_levels(record):
            table.add_row(
                str(level),
                *(format_value(record.metrics.get(f"c{level}_{n}")) for n in SWEEP_HEADLINES),
            )
        return table
    table = Table(title=record.benchmark)
    table.add_column("metric")
    table.add_column("value", justify="right")
    names = HEADLINES.get(record.benchmark) or tuple(record.metrics)
    for name in names:
        table.add_row(name, format_value(record.metrics.get(name)))
    return table


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def bench() -> None:
    """Benchmark an OpenAI-compatible server over HTTP (records, plots, comparisons)."""


@bench.command()
@target_options
@workload_options
@click.option("--num-prompts", type=click.IntRange(min=1), default=100, show_default=True)
@click.option(
    "--request-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Requests per second (default: all at once).",
)
@click.option(
    "--burstiness",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Gamma shape of the arrival gaps; 1 is Poisson.",
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Most requests in flight (default: no cap).",
)
@click.option("--num-warmups", type=click.IntRange(min=0), default=0, show_default=True)
@output_options
def serve(**options: Any) -> None:
    """Like `vllm bench serve`: one load, its latencies, throughputs and goodput."""
    target = _target(*(options[k] for k in ("base_url", "api", "model", "api_key", "timeout_s")))
    record = _run(
        run_serve(
            target,
            workload=_workload(options, options["num_prompts"]),
            load=LoadSpec(
                request_rate=options["request_rate"],
                burstiness=options["burstiness"],
                max_concurrency=options["max_concurrency"],
                seed=options["seed"],
            ),
            sampling=SamplingSpec(
                temperature=options["temperature"],
                seed=options["seed"],
                ignore_eos=options["ignore_eos"],
            ),
            slo=_slo(options["slo"]),
            num_warmups=options["num_warmups"],
            command=sys.argv,
            show_progress=not options["no_progress"],
        )
    )
    finish(record, options["records_dir"], plot=not options["no_plot"])


def _levels(text: str | None, max_concurrency: int) -> tuple[int, ...]:
    if text is None:
        return tuple(doubling_levels(max_concurrency))
    try:
        levels = tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: expected e.g. 1,2,4,8", param_hint="'--concurrencies'"
        ) from None
    if not levels or min(levels) < 1:
        raise click.BadParameter(
            "concurrencies are positive integers", param_hint="'--concurrencies'"
        )
    return levels


@bench.command("concurrency-sweep")
@target_options
@workload_options
@click.option("--concurrencies", default=None, help="Comma-separated levels, e.g. 1,2,4,8,16.")
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Without --concurrencies: 1, 2, 4, … up to this.",
)
@click.option(
    "--prompts-per-concurrency",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Each level sends this × its concurrency.",
)
@click.option("--num-warmups", type=click.IntRange(min=0), default=1, show_default=True)
@output_options
def concurrency_sweep(**options: Any) -> None:
    """Serve at max concurrency 1, 2, 4, … N: throughput and TPOT against concurrency."""
    target = _target(*(options[k] for k in ("base_url", "api", "model", "api_key", "timeout_s")))
    levels = _levels(options["concurrencies"], options["max_concurrency"])
    record = _run(
        run_concurrency_sweep(
            target,
            workload=_workload(options, options["prompts_per_concurrency"]),
            sweep=SweepSpec(
                concurrencies=levels, prompts_per_concurrency=options["prompts_per_concurrency"]
            ),
            sampling=SamplingSpec(
                temperature=options["temperature"],
                seed=options["seed"],
                ignore_eos=options["ignore_eos"],
            ),
            slo=_slo(options["slo"]),
            num_warmups=options["num_warmups"],
            command=sys.argv,
            show_progress=not options["no_progress"],
        )
    )
    finish(record, options["records_dir"], plot=not options["no_plot"])


@bench.command("decode-floor")
@target_options
@click.option("--input-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--output-len", type=click.IntRange(min=2), default=256, show_default=True)
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--num-warmups", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@output_options
def decode_floor(**options: Any) -> None:
    """One stream's decode speed (tokens/s after the first), median over runs."""
    target = _target(*(options[k] for k in ("base_url", "api", "model", "api_key", "timeout_s")))
    spec = DecodeFloorSpec(
        input_len=options["input_len"],
        output_len=options["output_len"],
        runs=options["runs"],
        num_warmups=options["num_warmups"],
        seed=options["seed"],
    )
    record = _run(
        run_decode_floor(
            target, spec=spec, command=sys.argv, show_progress=not options["no_progress"]
        )
    )
    finish(record, options["records_dir"], plot=not options["no_plot"])


@bench.command()
@target_options
@click.option("--prefix-len", type=click.IntRange(min=1), default=512, show_default=True)
@click.option("--suffix-len", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@output_options
def ttft(**options: Any) -> None:
    """Time to first token: cold prompts vs prompts sharing a warm prefix."""
    target = _target(*(options[k] for k in ("base_url", "api", "model", "api_key", "timeout_s")))
    spec = TtftSpec(
        prefix_len=options["prefix_len"],
        suffix_len=options["suffix_len"],
        max_tokens=options["max_tokens"],
        runs=options["runs"],
        seed=options["seed"],
    )
    record = _run(
        run_ttft(target, spec=spec, command=sys.argv, show_progress=not options["no_progress"])
    )
    finish(record, options["records_dir"], plot=not options["no_plot"])


@bench.command("default-tier-boot")
@click.argument("model", required=False)
@click.option(
    "--serve-arg",
    "serve_args",
    multiple=True,
    help="An extra `met serve` argument (repeatable), e.g. --serve-arg=--device --serve-arg=cpu.",
)
@click.option(
    "--base-url", default=None, help="Measure this running server instead of booting one."
)
@click.option(
    "--ready-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds the booted server may take to be ready.",
)
@click.option("--num-chats", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--prompt-words", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds one request may take.",
)
@output_options
def default_tier_boot(**options: Any) -> None:
    """Boot `met serve` with defaults, run 8 concurrent chats, record /memory vs budget."""
    spec = TierBootSpec(
        num_chats=options["num_chats"],
        prompt_words=options["prompt_words"],
        max_tokens=options["max_tokens"],
    )

    def measure(base_url: str, boot: dict[str, Any] | None) -> BenchRecord:
        target = ServerTarget(base_url=base_url, api="chat", timeout_s=options["timeout_s"])
        return _run(
            run_default_tier_boot(
                target,
                spec=spec,
                command=sys.argv,
                boot=boot,
                show_progress=not options["no_progress"],
            )
        )

    if options["base_url"] is not None:
        record = measure(options["base_url"], None)
    else:
        try:
            model = () if options["model"] is None else (options["model"],)
            with running_server(
                [*model, *options["serve_args"]], ready_timeout_s=options["ready_timeout"]
            ) as server:
                boot = {"command": list(server.command), "boot_s": server.ready_s}
                record = measure(server.base_url, boot)
        except ServerStartError as error:
            raise click.ClickException(str(error)) from error
    finish(record, options["records_dir"], plot=not options["no_plot"])


@bench.command("list")
@click.argument(
    "records_dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar=RECORDS_DIR_ENV,
    default=default_records_dir,
    required=False,
)
def list_records(records_dir: Path) -> None:
    """List the records under RECORDS_DIR (default: $METRALE_BENCH_DIR, else
    $XDG_DATA_HOME/metrale/bench or ~/.local/share/metrale/bench), oldest first."""
    table = Table(title=str(records_dir))
    for column in ("record", "benchmark", "recorded", "git", "model", "failed"):
        table.add_column(column)
    for path, record in find_records(records_dir):
        sha = (record.git.sha or "—")[:10] + ("+" if record.git.is_dirty else "")
        table.add_row(
            str(path.relative_to(records_dir)),
            record.benchmark,
            record.recorded_at,
            sha,
            record.model or "—",
            str(record.num_failed),
        )
    _stdout().print(table)


@bench.command()
@click.argument("a", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("b", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def compare(a: Path, b: Path) -> None:
    """A table of every metric in records A and B with the ratio B / A."""
    try:
        record_a, record_b = read_record(a), read_record(b)
    except RecordError as error:
        raise click.ClickException(str(error)) from error
    if record_a.benchmark != record_b.benchmark:
        click.echo(
            f"note: comparing a {record_a.benchmark} record with a {record_b.benchmark} one",
            err=True,
        )
    rows = compare_records(record_a, record_b)
    _stdout().print(comparison_table(rows, a_label=str(a), b_label=str(b)))


def main() -> None:
    """``metrale-bench``: the group as a command of its own."""
    bench.main(prog_name="metrale-bench")
