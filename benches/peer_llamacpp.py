"""llama.cpp's ``llama-server`` against ``met serve`` on one GGUF file, one server after the other.

Build ``llama-server`` first (once per machine; about 15-20 minutes on 2 cores), from
llama.cpp's sources (a checkout, or the copy vendored in the llama-cpp-python sdist):

    cmake -S llama.cpp -B ~/.cache/metrale-peers/llama.cpp/build -DCMAKE_BUILD_TYPE=Release \\
        -DGGML_NATIVE=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF
    cmake --build ~/.cache/metrale-peers/llama.cpp/build -j --target llama-server llama-perplexity
    # -> ~/.cache/metrale-peers/llama.cpp/build/bin/llama-server

Then, from the repository root:

    python benches/peer_llamacpp.py \\
        --llama-server ~/.cache/metrale-peers/llama.cpp/build/bin/llama-server \\
        [--model GGUF] [--threads 2] [--quick] [--met-arg=--quantization --met-arg=none] \\
        [--llama-arg=-fa --llama-arg=on] [--skip-llama] [--json figures.json]

On a CPU with AMX, a ``GGML_NATIVE`` build of llama.cpp may die from SIGSEGV in its AMX
matmuls inside a VM that does not grant AMX tile state; the script then measures it again with
``--no-repack`` (its fastest path that runs there) and says so.

The model defaults to the bundled SmolLM2-135M-Instruct Q4_1 GGUF (``met serve``'s default).
Each server in turn (llama.cpp first, then met; each is stopped with SIGTERM before the next
starts, so they never share the CPU) runs on a free 127.0.0.1 port with ``--threads`` threads
and room for 16 sequences at once, and is measured:

- time to ready: process start until ``GET /health`` answers 200; then, for ``met serve``,
  the loads wait until ``/v1/server`` says its compiled layer steps serve (they compile in
  the background; the time from start is printed too);
- prefill: a prompt of 256 random token ids (normal tokens of the GGUF's vocabulary, a fresh
  prompt per request so no prefix cache helps) through ``/v1/completions`` with
  ``max_tokens=1``; prompt tokens / whole request time, best of 3 after one warm-up;
- 1 stream and 16 streams: ``met bench serve`` (random text prompts of 128 tokens, 128 output
  tokens, ``ignore_eos``, temperature 0) at max concurrency 1 (8 prompts; ``--quick``: 4) and
  16 (32 prompts; ``--quick``: 16): output tokens/s and TPOT p50 from its record.

Printed: a table of both servers' figures and the speed-up (met ÷ llama.cpp for tokens/s,
llama.cpp ÷ met for TPOT) against the goals: 1 stream >= 1.0x, 16 streams >= 1.5x, prefill
>= 2x. ``--json PATH`` also writes the figures. The bench client runs on the same machine as
the servers and takes some of their CPU (the same share for both); ``met`` gets the thread
count through ``OMP_NUM_THREADS`` (and ``--threads`` when ``met serve`` has that flag).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from bench_host import cpu_line, host_fields

from metrale_bench.server_process import ServerProcess, ServerStartError, free_port
from metrale_config import read_gguf_header
from metrale_model_arch.model_source import resolve_model

HOST = "127.0.0.1"
MAX_STREAMS = 16
PREFILL_TOKENS = 256
PREFILL_REPEATS = 3
INPUT_LEN = 128
OUTPUT_LEN = 128
# llama.cpp splits its context over the -np slots: each slot holds 512 tokens, room for the
# prefill prompt and for a 128 + 128 request with slack for prompts a little over length.
LLAMA_SLOT_TOKENS = 512
READY_TIMEOUT_S = 600.0
COMPILE_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 600.0
# llama-server's flag that keeps weights in the GGUF's layout (no AMX / repacked buffers).
NO_REPACK = "--no-repack"
NORMAL_TOKEN_TYPE = 1  # tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control, ...
BUSY_SAMPLE_S = 2.0
BUSY_WARN_CORES = 0.25
GOALS = {"prefill_tok_s": 2.0, "stream1_output_tok_s": 1.0, "stream16_output_tok_s": 1.5}


@dataclass
class Figures:
    """One server's readings; ``None`` where a reading could not be taken."""

    ready_s: float | None = None
    # met only: process start until its compiled layer steps serve (the loads wait for them).
    compiled_s: float | None = None
    prefill_tok_s: float | None = None
    prefill_prompt_tokens: int | None = None
    stream1_output_tok_s: float | None = None
    stream1_tpot_p50_ms: float | None = None
    stream1_mean_input_tokens: float | None = None
    stream16_output_tok_s: float | None = None
    stream16_tpot_p50_ms: float | None = None
    stream16_mean_input_tokens: float | None = None
    failed_requests: int = 0
    busy_cores_before: float | None = None  # CPU others used just before the server started
    errors: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Plan:
    """What every server is put through."""

    stream1_prompts: int
    stream16_prompts: int
    token_ids: Sequence[int]  # the normal tokens prefill prompts are drawn from
    records_dir: Path


# --- the model ---------------------------------------------------------------------------------


def default_gguf() -> Path:
    """The GGUF ``met serve`` loads without a model argument."""
    source = resolve_model(None)
    if source.kind != "gguf":
        raise SystemExit(f"the default model {source.path} is not a GGUF file: pass --model")
    return source.path


def normal_token_ids(gguf: Path) -> list[int]:
    """The ids of the vocabulary's normal tokens (no control, unknown or byte tokens)."""
    fields = read_gguf_header(gguf).fields
    types = fields.get("tokenizer.ggml.token_type")
    if isinstance(types, list) and types:
        return [i for i, kind in enumerate(types) if kind == NORMAL_TOKEN_TYPE]
    tokens = fields.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise SystemExit(f"{gguf} has no tokenizer.ggml.tokens")
    return list(range(len(tokens) // 100, len(tokens) * 9 // 10))  # clear of special tokens


# --- the servers -------------------------------------------------------------------------------


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from ``/proc/stat``; ``None`` off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def busy_cores(interval_s: float = BUSY_SAMPLE_S) -> float | None:
    """How many cores' worth of CPU the machine used over ``interval_s`` (other processes,
    when no server runs): a figure above ``BUSY_WARN_CORES`` makes the readings unfair."""
    first = _cpu_times()
    time.sleep(interval_s)
    second = _cpu_times()
    if first is None or second is None or second[1] == first[1]:
        return None
    return round((second[0] - first[0]) / (second[1] - first[1]) * (os.cpu_count() or 1), 2)


def log_file(prefix: str) -> Path:
    handle, name = tempfile.mkstemp(prefix=prefix, suffix=".log")
    os.close(handle)
    return Path(name)


def spawn(command: list[str], port: int, env: Mapping[str, str], log_prefix: str) -> ServerProcess:
    """Start ``command`` (a server listening on ``port``) with its output in a log file."""
    log_path = log_file(log_prefix)
    started_at = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=dict(env)
        )
    return ServerProcess(
        process=process,
        host=HOST,
        port=port,
        log_path=log_path,
        command=tuple(command),
        started_at=started_at,
    )


def llama_command(
    binary: Path, gguf: Path, port: int, threads: int, extra: Sequence[str]
) -> list[str]:
    return [
        str(binary),
        "-m",
        str(gguf),
        "--host",
        HOST,
        "--port",
        str(port),
        "-t",
        str(threads),
        "-np",
        str(MAX_STREAMS),
        "-c",
        str(MAX_STREAMS * LLAMA_SLOT_TOKENS),
        *extra,
    ]


def met_has_flag(flag: str) -> bool:
    """Whether this checkout's ``met serve --help`` lists ``flag``."""
    result = subprocess.run(
        [sys.executable, "-m", "metrale_server", "serve", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    return flag in result.stdout.split()


def met_command(gguf: Path, port: int, threads: int, extra: Sequence[str]) -> list[str]:
    command = [sys.executable, "-m", "metrale_server", "serve", str(gguf), "--no-tui"]
    command += ["--host", HOST, "--port", str(port)]
    command += ["--max-batch-size", str(MAX_STREAMS)]
    if "--threads" not in extra and met_has_flag("--threads"):
        command += ["--threads", str(threads)]
    return [*command, *extra]


def threads_env(threads: int) -> dict[str, str]:
    """This environment with the OpenMP / MKL thread counts set (torch reads them at start)."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


# --- the measurements --------------------------------------------------------------------------


def served_model(base_url: str) -> str:
    response = httpx.get(f"{base_url}/v1/models", timeout=30)
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


def time_prefill(client: httpx.Client, model: str, prompt: list[int]) -> tuple[float, int]:
    """Seconds for one ``max_tokens=1`` completion of ``prompt``, and its prompt token count."""
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    start = time.perf_counter()
    response = client.post("/v1/completions", json={**body, "ignore_eos": True})
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        raise RuntimeError(f"prefill: HTTP {response.status_code}: {response.text[:300]}")
    usage = response.json().get("usage") or {}
    prompt_tokens = usage.get("prompt_tokens")
    return elapsed, prompt_tokens if isinstance(prompt_tokens, int) else len(prompt)


def measure_prefill(base_url: str, token_ids: Sequence[int], seed: int = 0) -> tuple[float, int]:
    """Prompt tokens/s of the best of ``PREFILL_REPEATS`` fresh prompts after a warm-up."""
    rng = random.Random(seed)
    model = served_model(base_url)
    runs: list[tuple[float, int]] = []
    with httpx.Client(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as client:
        for _ in range(1 + PREFILL_REPEATS):
            prompt = [rng.choice(token_ids) for _ in range(PREFILL_TOKENS)]
            runs.append(time_prefill(client, model, prompt))
    elapsed, prompt_tokens = min(runs[1:])
    return prompt_tokens / elapsed, prompt_tokens


def bench_serve(base_url: str, concurrency: int, num_prompts: int, records_dir: Path) -> Any:
    """Run ``met bench serve`` against ``base_url``; its record as JSON."""
    records_dir = records_dir / f"c{concurrency}"
    command = [sys.executable, "-m", "metrale_bench", "serve", "--base-url", base_url]
    command += ["--dataset", "random", "--random-input-len", str(INPUT_LEN)]
    command += ["--random-output-len", str(OUTPUT_LEN), "--ignore-eos", "--temperature", "0"]
    command += ["--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency)]
    command += ["--num-warmups", "1", "--timeout", str(REQUEST_TIMEOUT_S)]
    command += ["--records-dir", str(records_dir), "--no-plot", "--no-progress"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    records = sorted((records_dir / "serve").glob("*.json"))
    if not records:
        raise RuntimeError(
            f"met bench serve wrote no record (exit {result.returncode}):\n"
            f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    return json.loads(records[-1].read_text(encoding="utf-8"))


def run_loads(base_url: str, plan: Plan, figures: Figures) -> None:
    """The 1-stream and 16-stream loads, into ``figures``."""
    for name, concurrency, num_prompts in (
        ("stream1", 1, plan.stream1_prompts),
        ("stream16", MAX_STREAMS, plan.stream16_prompts),
    ):
        record = bench_serve(base_url, concurrency, num_prompts, plan.records_dir)
        metrics = record["metrics"]
        setattr(figures, f"{name}_output_tok_s", metrics.get("output_tok_s"))
        setattr(figures, f"{name}_tpot_p50_ms", metrics.get("tpot_p50_ms"))
        setattr(figures, f"{name}_mean_input_tokens", metrics.get("mean_input_tokens"))
        figures.failed_requests += int(record.get("num_failed") or 0)
        figures.errors += [str(e) for e in record.get("errors") or ()]
        say(f"  {name}: {_num(metrics.get('output_tok_s'))} output tok/s")


def wait_for_compiled_steps(base_url: str, ready_s: float) -> float | None:
    """For ``met serve``: wait while ``/v1/server`` says its layer steps are compiling; the
    seconds from process start until compiled (``None``: another server, or never compiled)."""
    started = time.perf_counter() - ready_s
    while True:
        try:
            state = httpx.get(f"{base_url}/v1/server", timeout=5).json().get("layer_steps")
        except (httpx.HTTPError, ValueError):
            return None
        if state != "compiling":
            return time.perf_counter() - started if state in {"compiled", "native"} else None
        if time.perf_counter() - started > COMPILE_TIMEOUT_S:
            say("  the compile did not finish: measuring the eager steps")
            return None
        time.sleep(0.2)


def measure_server(
    label: str, command: Callable[[int], list[str]], env: Mapping[str, str], plan: Plan
) -> Figures:
    """Boot the server ``command(port)`` starts, take every reading, stop it (SIGTERM, wait)."""
    busy = busy_cores()
    say(f"{label}: starting (CPU busy before: {_num(busy)} cores)")
    port = free_port(HOST)
    server = spawn(command(port), port, env, f"peer-{label}-")
    figures = Figures(command=list(server.command), busy_cores_before=busy)
    try:
        server.wait_ready(READY_TIMEOUT_S)
        figures.ready_s = server.ready_s
        say(f"  ready in {_num(server.ready_s)} s (log: {server.log_path})")
        figures.compiled_s = wait_for_compiled_steps(server.base_url, server.ready_s or 0.0)
        figures.prefill_tok_s, figures.prefill_prompt_tokens = measure_prefill(
            server.base_url, plan.token_ids
        )
        say(f"  prefill: {_num(figures.prefill_tok_s)} tok/s")
        run_loads(server.base_url, plan, figures)
    finally:
        server.stop()
    return figures


# --- the report --------------------------------------------------------------------------------

ROWS = (
    ("ready_s", "time to ready (s)"),
    ("compiled_s", "compiled steps serving after (s)"),
    ("prefill_tok_s", f"prefill tok/s ({PREFILL_TOKENS}-token prompt)"),
    ("stream1_output_tok_s", "1 stream output tok/s"),
    ("stream1_tpot_p50_ms", "1 stream TPOT p50 (ms)"),
    ("stream16_output_tok_s", f"{MAX_STREAMS} streams output tok/s"),
    ("stream16_tpot_p50_ms", f"{MAX_STREAMS} streams TPOT p50 (ms)"),
    ("stream16_mean_input_tokens", "load prompt tokens (mean)"),
    ("failed_requests", "failed requests"),
    ("busy_cores_before", "CPU busy before start (cores)"),
)
# Throughputs get met ÷ llama.cpp; times get llama.cpp ÷ met (above 1: met is faster).
THROUGHPUT_ROWS = ("prefill_tok_s", "stream1_output_tok_s", "stream16_output_tok_s")
TIME_ROWS = ("stream1_tpot_p50_ms", "stream16_tpot_p50_ms")


def _num(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def ratio(name: str, llama: Figures | None, met: Figures | None) -> float | None:
    """met ÷ llama.cpp for a throughput, llama.cpp ÷ met for a TPOT; ``None`` otherwise."""
    if llama is None or met is None or name not in (*THROUGHPUT_ROWS, *TIME_ROWS):
        return None
    a, b = getattr(llama, name), getattr(met, name)
    if not a or not b:
        return None
    return float(b / a if name in THROUGHPUT_ROWS else a / b)


def goal_text(name: str, value: float | None) -> str:
    goal = GOALS.get(name)
    if goal is None:
        return ""
    verdict = "" if value is None else ("  met" if value >= goal else "  missed")
    return f">= {goal:.1f}x{verdict}"


def table(llama: Figures | None, met: Figures | None) -> str:
    head = ("metric", "llama.cpp", "met", "speed-up", "goal")
    lines = [head]
    for name, title in ROWS:
        value = ratio(name, llama, met)
        lines.append(
            (
                title,
                _num(None if llama is None else getattr(llama, name)),
                _num(None if met is None else getattr(met, name)),
                "—" if value is None else f"{value:.2f}x",
                goal_text(name, value),
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = []
    for title, *cells, goal in lines:
        numbers = (cell.rjust(width) for cell, width in zip(cells, widths[1:], strict=False))
        text.append("  ".join([title.ljust(widths[0]), *numbers, goal]))
    text.append("speed-up: met ÷ llama.cpp for tok/s, llama.cpp ÷ met for TPOT (> 1: met faster)")
    return "\n".join(line.rstrip() for line in text)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- main --------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", type=Path, help="the llama-server binary")
    parser.add_argument("--model", type=Path, help="GGUF file (default: the bundled SmolLM2)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each server")
    parser.add_argument("--quick", action="store_true", help="fewer prompts per load")
    parser.add_argument(
        "--met-arg", action="append", default=[], help="extra `met serve` argument (repeatable)"
    )
    parser.add_argument(
        "--llama-arg", action="append", default=[], help="extra llama-server argument"
    )
    parser.add_argument("--skip-llama", action="store_true", help="measure met only")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    if args.llama_server is None and not args.skip_llama:
        parser.error("--llama-server PATH is required (or --skip-llama)")
    if args.llama_server is not None and not os.access(args.llama_server, os.X_OK):
        parser.error(f"{args.llama_server} is not an executable file")
    return args


def write_json(
    path: Path, args: argparse.Namespace, gguf: Path, llama: Figures | None, met: Figures
) -> None:
    document = {
        "model": str(gguf),
        "host": host_fields(),
        "threads": args.threads,
        "quick": args.quick,
        "met_args": args.met_arg,
        "llama_args": args.llama_arg,
        "llama_server": None if args.llama_server is None else str(args.llama_server),
        "llama.cpp": None if llama is None else asdict(llama),
        "met": asdict(met),
        "speed_up": {name: ratio(name, llama, met) for name in (*THROUGHPUT_ROWS, *TIME_ROWS)},
        "goals": GOALS,
    }
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    say(f"figures: {path}")


def measure_llama(
    args: argparse.Namespace, gguf: Path, env: Mapping[str, str], plan: Plan
) -> Figures:
    """llama.cpp's readings. A build with GGML_NATIVE on an AMX CPU may die from a signal in
    its repacked (AMX) matmuls where the kernel does not grant the process AMX tile state (seen
    in a VM: SIGSEGV at ``ldtilecfg``); it is then measured once more with ``--no-repack``, its
    fastest path that runs there, said on stderr (and in the JSON's command)."""

    def measure(extra: Sequence[str]) -> Figures:
        return measure_server(
            "llama.cpp",
            lambda port: llama_command(args.llama_server, gguf, port, args.threads, extra),
            env,
            plan,
        )

    try:
        return measure(args.llama_arg)
    except ServerStartError as error:
        crashed = error.returncode is not None and error.returncode < 0
        if not crashed or NO_REPACK in args.llama_arg:
            raise
        say(f"  llama.cpp died from signal {-error.returncode}: measuring it with {NO_REPACK}")
        return measure([*args.llama_arg, NO_REPACK])


def run_both(args: argparse.Namespace, gguf: Path, plan: Plan) -> tuple[Figures | None, Figures]:
    """llama.cpp (unless skipped), then met, each alone on the CPU."""
    env = threads_env(args.threads)
    llama = None
    if not args.skip_llama:
        llama = measure_llama(args, gguf, env, plan)
    met = measure_server(
        "met", lambda port: met_command(gguf, port, args.threads, args.met_arg), env, plan
    )
    return llama, met


def main() -> None:
    args = parse_args()
    gguf = (args.model or default_gguf()).expanduser().absolute()
    say(cpu_line())
    say(f"model: {gguf}\nthreads: {args.threads}  met args: {args.met_arg}")
    records_dir = Path(tempfile.mkdtemp(prefix="peer-llamacpp-"))
    plan = Plan(
        stream1_prompts=4 if args.quick else 8,
        stream16_prompts=16 if args.quick else 32,
        token_ids=normal_token_ids(gguf),
        records_dir=records_dir,
    )
    try:
        llama, met = run_both(args, gguf, plan)
    except (ServerStartError, RuntimeError, httpx.HTTPError) as error:
        raise SystemExit(f"error: {error}") from error
    finally:
        shutil.rmtree(records_dir, ignore_errors=True)
    print(table(llama, met))
    for label, figures in (("llama.cpp", llama), ("met", met)):
        if figures is None:
            continue
        for message in figures.errors:
            print(f"{label} error: {message}", file=sys.stderr)
        if (figures.busy_cores_before or 0.0) > BUSY_WARN_CORES:
            print(
                f"warning: other processes used {figures.busy_cores_before:.2f} cores before "
                f"{label} started: its figures are unreliable",
                file=sys.stderr,
            )
    if args.json is not None:
        write_json(args.json, args, gguf, llama, met)


if __name__ == "__main__":
    main()
