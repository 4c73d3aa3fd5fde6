"""Default model load time: GGUF read + dequantize + build, against transformers' GGUF loader.

    python benches/load_time.py [--repeats 5] [--baseline]

Both sides load the same file to the same format: float32 weights, the GGUF's blocks
dequantized (``load_model(dtype=float32)``, quantization ``none``; transformers dequantizes
every GGUF tensor), plus the tokenizer. Both are timed warm: one untimed load of each first
(the file in the page cache, the modules imported, lazy imports done), then the median of
``--repeats`` timed loads of each, in this process. Prints metrale's median and each stage's
share; with ``--baseline`` also transformers' ``AutoModelForCausalLM.from_pretrained(...,
gguf_file=...)`` + ``AutoTokenizer.from_pretrained`` and the ratio. ``met serve``'s default
format for this file (q4: the Q4_1 blocks kept, no dequantize) is not what is timed here.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_host import cpu_line

from metrale_config import model_config_from_gguf_header, read_gguf_header
from metrale_model_arch import (
    ChatTemplate,
    LoadOptions,
    Tokenizer,
    load_gguf_model,
    load_model,
    resolve_model,
)


def time_stages(path: str) -> dict[str, float]:
    times: dict[str, float] = {}
    start = time.perf_counter()
    header = read_gguf_header(path)
    model_config_from_gguf_header(header)
    times["header + config"] = time.perf_counter() - start
    start = time.perf_counter()
    load_gguf_model(header, LoadOptions(dtype=torch.float32, device="cpu"))
    times["dequantize + build"] = time.perf_counter() - start
    start = time.perf_counter()
    tokenizer = Tokenizer.from_gguf_fields(header.fields)
    ChatTemplate.from_gguf_fields(header.fields, special_tokens=tokenizer.special_tokens_map)
    times["tokenizer + template"] = time.perf_counter() - start
    return times


def warm_median(load: Callable[[], object], repeats: int) -> tuple[float, list[float]]:
    """One untimed load, then the median of ``repeats`` timed ones (and those times)."""
    load()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        load()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def _seconds(times: list[float]) -> str:
    return ", ".join(f"{t:.2f}" for t in times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", action="store_true", help="also time transformers")
    args = parser.parse_args()

    print(cpu_line())
    path = str(resolve_model(None).path)
    print(f"model: {path}")
    print(
        "both sides warm (one untimed load each first), float32 weights (the GGUF dequantized) "
        f"+ tokenizer, median of {args.repeats}"
    )
    ours, times = warm_median(
        lambda: load_model(
            None, LoadOptions(dtype=torch.float32, device="cpu", quantization="none")
        ),
        args.repeats,
    )
    print(
        f"metrale load_model(dtype=float32, quantization='none'): {ours:.2f} s  (goal <= 3 s; "
        f"runs: {_seconds(times)} s)"
    )
    for stage, seconds in time_stages(path).items():
        print(f"  {stage:<22} {seconds:.2f} s")

    if args.baseline:
        import transformers

        gguf = Path(path)

        def load_transformers() -> None:
            transformers.AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
            transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)

        baseline, baseline_times = warm_median(load_transformers, args.repeats)
        print(
            f"transformers from_pretrained(gguf_file=..., dtype=float32) + AutoTokenizer: "
            f"{baseline:.2f} s  (runs: {_seconds(baseline_times)} s)"
        )
        print(f"ratio transformers / metrale, both warm: {baseline / ours:.1f}x")


if __name__ == "__main__":
    main()
