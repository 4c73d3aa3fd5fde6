"""Output tokens/s of ``met serve`` with its terminal dashboard ÷ without it (goal >= 0.98).

    python benches/tui_overhead.py [--quick] [--model PATH] [--repeats 3]

Each round starts a ``met serve`` child twice: once with ``--no-tui`` (stdout a file), once
on a pseudo-terminal of 80×24 so the dashboard runs (polling the server every second, drawing
at most 4 frames a second; a thread here reads and discards the terminal's output). Each gets
a warm-up request, then the same streaming completions sent at once (the workload of
``http_throughput.py``: random token ids, ``ignore_eos``, temperature 0). Throughput =
requested output tokens / wall time; the best run of each mode counts. Prints both, their
ratio, the ratio of the medians, and the server process's CPU seconds per run with and
without the dashboard. The client runs on the same machine, so on a small, busy box the
throughput ratio is noisy: read it next to the spread of the runs, and the CPU figure.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import pty
import statistics
import struct
import sys
import termios
import threading
from pathlib import Path

import openai
from bench_host import cpu_line

sys.path.insert(0, str(Path(__file__).parent))
from http_throughput import make_workload, run_http

from metrale_bench.server_process import ServerProcess

TERMINAL_ROWS, TERMINAL_COLUMNS = 24, 80


def start_on_terminal(serve_args: list[str]) -> ServerProcess:
    """``met serve`` with stdin and stdout on a new pseudo-terminal (the dashboard shows)."""
    controller, terminal = pty.openpty()
    size = struct.pack("HHHH", TERMINAL_ROWS, TERMINAL_COLUMNS, 0, 0)
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, size)
    env = {k: v for k, v in os.environ.items() if k != "METRALE_NO_TUI"}
    env.update(TERM="xterm-256color", COLUMNS=str(TERMINAL_COLUMNS), LINES=str(TERMINAL_ROWS))
    server = ServerProcess.start(serve_args, env=env, terminal_fd=terminal)
    os.close(terminal)
    threading.Thread(target=_discard, args=(controller,), daemon=True).start()
    return server


def _discard(fd: int) -> None:
    """Read the terminal's output so the dashboard never blocks on a full buffer."""
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(server: ServerProcess, workload: list[tuple[list[int], int]]) -> tuple[float, float]:
    """Wall seconds of the workload, and the CPU seconds the server spent meanwhile."""
    try:
        server.wait_ready(timeout_s=300)
        models = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused").models.list()
        cpu_before = process_cpu_s(server.pid)
        elapsed = asyncio.run(run_http(server.base_url, models.data[0].id, workload))
        return elapsed, process_cpu_s(server.pid) - cpu_before
    finally:
        exit_code = server.stop(timeout_s=60)
        assert exit_code == 0, server.log_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short requests, a few minutes")
    parser.add_argument("--model", default=None, help="default: the bundled SmolLM2")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(cpu_line())
    output_range = (8, 32) if args.quick else (64, 192)
    workload = make_workload(args.num_requests, (16, 64), output_range, args.seed)
    num_output = sum(n for _, n in workload)
    num_kv_blocks = sum(-(-(len(ids) + n) // 16) for ids, n in workload) + 16
    serve_args = [] if args.model is None else [args.model]
    serve_args += ["--dtype", "float32", "--device", "cpu", "--max-seq-len", "512",
                   "--max-batch-size", str(args.num_requests),
                   "--num-kv-blocks", str(num_kv_blocks)]  # fmt: skip
    print(f"requests: {len(workload)}  output tokens: {num_output}  serve: {serve_args}")

    plain_times: list[float] = []
    tui_times: list[float] = []
    plain_cpu: list[float] = []
    tui_cpu: list[float] = []
    for _ in range(args.repeats):
        elapsed, cpu_s = measure(ServerProcess.start([*serve_args, "--no-tui"]), workload)
        plain_times.append(elapsed)
        plain_cpu.append(cpu_s)
        elapsed, cpu_s = measure(start_on_terminal(serve_args), workload)
        tui_times.append(elapsed)
        tui_cpu.append(cpu_s)
    plain_rate = num_output / min(plain_times)
    tui_rate = num_output / min(tui_times)
    print(f"no dashboard: {plain_rate:.1f} output tok/s (runs: {_seconds(plain_times)})")
    print(f"dashboard:    {tui_rate:.1f} output tok/s (runs: {_seconds(tui_times)})")
    print(f"ratio dashboard / none: {tui_rate / plain_rate:.3f} (goal >= 0.98)")
    median_ratio = statistics.median(plain_times) / statistics.median(tui_times)
    print(f"ratio of the medians: {median_ratio:.3f}")
    # CPU per run is far less sensitive than wall time to other work on the machine.
    extra_cpu = statistics.median(tui_cpu) / statistics.median(plain_cpu) - 1
    print(
        f"server CPU per run (median): {statistics.median(plain_cpu):.2f} s without, "
        f"{statistics.median(tui_cpu):.2f} s with the dashboard ({extra_cpu:+.1%})"
    )


def _seconds(times: list[float]) -> str:
    return ", ".join(f"{t:.2f} s" for t in times)


if __name__ == "__main__":
    main()
