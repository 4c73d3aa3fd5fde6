"""Output tokens/s of ``met serve`` with its web dashboard open in a browser ÷ without it
(goal: within noise, >= 0.98), and the server's CPU seconds per run each way.

    python benches/webui_overhead.py [--quick] [--model PATH] [--repeats 3]

One ``met serve`` child (``--no-tui``) serves every run. Runs alternate: the workload of
``http_throughput.py`` (streaming completions of random token ids sent at once, ``ignore_eos``,
temperature 0) with no page open, then the same with ``/dashboard`` open in a headless Chromium
(Debian's ``chromium``, driven by Playwright; it polls ``/metrics`` once a second, ``/memory``,
``/v1/requests/recent`` and ``/v1/server`` as a person's tab would, and draws its charts).
Throughput = requested output tokens / wall time; the best run of each mode counts. The browser
runs on the same machine as the server and the client, so on a small box its drawing takes CPU
the engine would otherwise have (and a torch thread the kernel parks stalls every op of a
step): last, with the page open on an idle server for ``--idle-s`` seconds, the CPU seconds of
the server (what the page itself costs it: the polls it answers) and of Chromium's processes.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
from bench_host import cpu_line

sys.path.insert(0, str(Path(__file__).parent))
from http_throughput import make_workload, run_http
from tui_overhead import process_cpu_s

from metrale_bench.server_process import ServerProcess

Workload = list[tuple[list[int], int]]


def timed_run(server: ServerProcess, model: str, workload: Workload) -> tuple[float, float]:
    """Wall seconds of the workload, and the CPU seconds the server spent meanwhile (the
    client's event loop on a thread of its own: Playwright's runs on this one)."""
    cpu_before = process_cpu_s(server.pid)
    with ThreadPoolExecutor(max_workers=1) as client:
        elapsed = client.submit(asyncio.run, run_http(server.base_url, model, workload)).result()
    return elapsed, process_cpu_s(server.pid) - cpu_before


def chromium_cpu_s() -> float:
    """CPU seconds so far of every process whose executable is named chromium."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        try:
            executable = (entry / "cmdline").read_bytes().split(b"\0")[0]
            if entry.name.isdigit() and executable.endswith(b"chromium"):
                total += process_cpu_s(int(entry.name))
        except OSError:
            continue  # ended meanwhile
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short requests, a few minutes")
    parser.add_argument("--model", default=None, help="default: the bundled SmolLM2")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("needs Debian's chromium on the PATH (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    print(cpu_line())
    output_range = (8, 32) if args.quick else (64, 192)
    workload = make_workload(args.num_requests, (16, 64), output_range, args.seed)
    num_output = sum(n for _, n in workload)
    num_kv_blocks = sum(-(-(len(ids) + n) // 16) for ids, n in workload) + 16
    serve_args = [] if args.model is None else [args.model]
    serve_args += ["--dtype", "float32", "--device", "cpu", "--max-seq-len", "512",
                   "--max-batch-size", str(args.num_requests),
                   "--num-kv-blocks", str(num_kv_blocks), "--no-tui"]  # fmt: skip
    print(f"requests: {len(workload)}  output tokens: {num_output}  serve: {serve_args}")

    times: dict[str, list[float]] = {"none": [], "dashboard": []}
    cpu: dict[str, list[float]] = {"none": [], "dashboard": []}
    server = ServerProcess.start(serve_args)
    try:
        server.wait_ready(timeout_s=300)
        models = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused").models.list()
        model = models.data[0].id
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium)
            try:
                for _ in range(args.repeats):
                    elapsed, cpu_s = timed_run(server, model, workload)
                    times["none"].append(elapsed)
                    cpu["none"].append(cpu_s)
                    page = browser.new_page()
                    page.goto(f"{server.base_url}/dashboard")
                    page.wait_for_timeout(2000)  # its first polls answered, charts drawn
                    elapsed, cpu_s = timed_run(server, model, workload)
                    times["dashboard"].append(elapsed)
                    cpu["dashboard"].append(cpu_s)
                    page.close()
                page = browser.new_page()
                page.goto(f"{server.base_url}/dashboard")
                page.wait_for_timeout(2000)
                server_before, browser_before = process_cpu_s(server.pid), chromium_cpu_s()
                page.wait_for_timeout(args.idle_s * 1000)
                idle_server = process_cpu_s(server.pid) - server_before
                idle_browser = chromium_cpu_s() - browser_before
            finally:
                browser.close()
    finally:
        exit_code = server.stop(timeout_s=60)
    assert exit_code == 0, server.log_text()
    plain_rate = num_output / min(times["none"])
    page_rate = num_output / min(times["dashboard"])
    print(f"no page open:   {plain_rate:.1f} output tok/s (runs: {_seconds(times['none'])})")
    print(f"dashboard open: {page_rate:.1f} output tok/s (runs: {_seconds(times['dashboard'])})")
    print(f"ratio dashboard / none: {page_rate / plain_rate:.3f} (goal >= 0.98)")
    median_ratio = statistics.median(times["none"]) / statistics.median(times["dashboard"])
    print(f"ratio of the medians: {median_ratio:.3f}")
    plain_cpu, page_cpu = statistics.median(cpu["none"]), statistics.median(cpu["dashboard"])
    print(
        f"server CPU per run (median): {plain_cpu:.2f} s without, {page_cpu:.2f} s with the "
        f"dashboard open ({page_cpu / plain_cpu - 1:+.1%})"
    )
    per_s = 1e3 / args.idle_s
    print(
        f"dashboard open on the idle server, per second: server {idle_server * per_s:.1f} ms "
        f"CPU, Chromium {idle_browser * per_s:.1f} ms CPU"
    )


def _seconds(times: list[float]) -> str:
    return ", ".join(f"{t:.2f} s" for t in times)


if __name__ == "__main__":
    main()
