"""Time to ready: process start of ``met serve`` (default model) until ``/health`` answers 200.

    python benches/time_to_ready.py [--repeats 5]

Each run starts a fresh ``python -m metrale_server serve --no-tui`` on a free port and polls
``/health`` every 20 ms; printed: the time to the first 200, the median of the runs, against
the goal (2.5 s), and whether a 503 (socket up, model loading) was seen first. The baseline measured
in the same run is the bare interpreter importing torch, the floor any torch server pays.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from bench_host import cpu_line

from metrale_bench.server_process import ServerProcess

GOAL_S = 2.5


def torch_import_s() -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.monotonic() - start


def boot_once() -> tuple[bool, float]:
    server = ServerProcess.start(["--no-tui"])
    try:
        server.wait_ready(timeout_s=120)
        assert server.ready_s is not None
        return 503 in server.health_statuses, server.ready_s
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(cpu_line())
    boot_once()  # warm the page cache (wheels, the GGUF file)
    runs = [boot_once() for _ in range(args.repeats)]
    floor = statistics.median(torch_import_s() for _ in range(args.repeats))
    ready_s = statistics.median(ready for _, ready in runs)
    print(f"runs: {', '.join(f'{ready:.2f}' for _, ready in runs)} s")
    print(f"503 while loading seen in {sum(seen for seen, _ in runs)} of {len(runs)} runs")
    print(f"ready (/health 200): {ready_s:.2f} s (goal <= {GOAL_S} s)")
    print(f"baseline, python -c 'import torch': {floor:.2f} s")
    print(f"ready / baseline: {ready_s / floor:.2f}x")


if __name__ == "__main__":
    main()
